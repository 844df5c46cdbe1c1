"""Float64 sums over batches, and how an analysis's result splits into what adds and what must agree.

Every streamed analysis turns one batch's result into **parts**: named float64 tensors that add over
batches (for a metric-weighted result, ``weight_b * field_b`` and ``weight_b`` itself), and **fixed**
fields that every batch must give identically (labels, the edge layout, the fractions of a curve),
kept as JSON so that a resume file and the ranks of a distributed run can carry and compare them.
:class:`Sums` accumulates both; the analysis builds its result from the totals.

:func:`weighted` writes the two halves for a frozen-dataclass result whose fields are means over
the examples: ``mean`` fields are averaged with the batches' weights, ``same`` fields must agree, a
field it does not know must hold its default in every batch (else the combination is refused,
naming the field: an option added to a helper later streams only once its field is declared here).

>>> import torch
>>> s = Sums()
>>> s.add({"x": torch.tensor([2.0]), "weight": torch.tensor(1.0)}, {"labels": ["a"]})
>>> s.add({"x": torch.tensor([9.0]), "weight": torch.tensor(3.0)}, {"labels": ["a"]})
>>> float(s.totals["x"] / s.totals["weight"]), s.batches   # parts are weight x field: (1 * 2 + 3 * 3) / 4
(2.75, 2)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import torch

from .._messages import clip, few
from ..circuits.graph import EdgeLayout, edge_layout

__all__ = ["Sums", "weighted", "to_json", "from_json"]

Parts = dict[str, torch.Tensor]


class Sums:
    """Float64 totals of the parts of the batches read so far, the fixed fields they agree on, and how
    many batches were added (a local accumulator: one per streamed call).

    Attributes:
        totals: name -> float64 tensor, the sum over the batches of that part.
        fixed: the fields every batch gave identically (JSON values), or None before the first batch.
        batches: how many batches were added.
    """

    def __init__(self, totals: Parts | None = None, fixed: dict | None = None, batches: int = 0) -> None:
        self.totals: Parts = dict(totals or {})
        self.fixed = fixed
        self.batches = batches

    def add(self, parts: Parts, fixed: dict) -> None:
        """Add one batch's ``parts`` (float64, summed in place) after checking its ``fixed`` fields.

        Raises:
            ValueError: a part whose shape differs from the earlier batches' (e.g. batches of different
                lengths where a result has one entry per position), a part missing or new, or a fixed
                field that differs (each named).
        """
        fixed = from_json(to_json(fixed))  # the form a resume file or another rank gives back
        self.check(self.fixed, fixed, "this batch")
        if self.totals and set(parts) != set(self.totals):
            raise ValueError(f"this batch's parts {few(sorted(parts))} differ from the earlier batches' "
                             f"{few(sorted(self.totals))}")
        for name, value in parts.items():
            value = value.detach().to("cpu", torch.float64)
            if name in self.totals and self.totals[name].shape != value.shape:
                raise ValueError(f"{name}: shape {tuple(value.shape)} in this batch, {tuple(self.totals[name].shape)} "
                                 "in the earlier ones; a streamed result is one call's on the concatenated batch, so "
                                 "every batch must give it the same shape (e.g. pad every batch to one length)")
            if name in self.totals:
                self.totals[name] += value
            else:
                self.totals[name] = value.clone()
        self.fixed = fixed
        self.batches += 1

    @staticmethod
    def check(mine: dict | None, theirs: dict | None, who: str) -> None:
        """Raise a ValueError naming the first fixed field on which ``theirs`` (from ``who``) differs."""
        if mine is None or theirs is None:
            return
        for key in sorted(set(mine) | set(theirs)):
            if to_json(mine.get(key)) != to_json(theirs.get(key)):
                raise ValueError(f"{key} differs between {who} ({clip(to_json(theirs.get(key)), 100)}) and the earlier "
                                 f"batches ({clip(to_json(mine.get(key)), 100)}): every batch must agree on it")


def to_json(value: Any) -> str:
    """``value`` as canonical JSON; an :class:`rs_interp.circuits.EdgeLayout` as its labels."""
    def plain(v: Any) -> Any:
        if isinstance(v, EdgeLayout):
            return {"edge_layout": [list(v.senders), list(v.receivers)]}
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise ValueError(f"a fixed field holds a {type(v).__name__}, which rs_interp.scale cannot compare across "
                         "batches")

    return json.dumps(plain(value), sort_keys=True)


def from_json(text: str) -> Any:
    """The value :func:`to_json` wrote (lists come back as lists)."""
    return json.loads(text)


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def decode(value: Any, model: Any) -> Any:
    """A fixed field back as its result holds it: lists as tuples, an edge layout rebuilt from ``model``
    (and checked against the labels the batches gave)."""
    if isinstance(value, dict) and set(value) == {"edge_layout"}:
        layout = edge_layout(model)
        if [list(layout.senders), list(layout.receivers)] != value["edge_layout"]:
            raise ValueError("the edge layout the batches were scored on is not this model's")
        return layout
    return _tuples(value)


def _as64(value: Any, name: str) -> tuple[torch.Tensor, str]:
    """A mean field as a float64 tensor, and how to give it back (``float``, ``tuple`` or ``tensor``)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float64), "tensor"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64), "float"
    if isinstance(value, (tuple, list)) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        return torch.tensor([float(x) for x in value], dtype=torch.float64), "tuple"
    raise ValueError(f"{name}: a {type(value).__name__} cannot be averaged over batches")


def _back(value: torch.Tensor, how: str) -> Any:
    """A mean field as its result holds it (the inverse of :func:`_as64`)."""
    return float(value) if how == "float" else tuple(value.tolist()) if how == "tuple" else value


def weighted(cls: type, *, mean: Sequence[str], same: Sequence[str] = (), derived: Sequence[str] = (),
             finish: Callable[[dict], dict] | None = None) -> tuple[Callable, Callable]:
    """``(parts, build)`` for a frozen-dataclass result ``cls`` whose ``mean`` fields are means over the
    batch's examples: ``parts(result, weight)`` gives ``weight * field`` per mean field and ``weight``,
    and the fixed fields; ``build(totals, fixed, model)`` divides by the total weight, restores the
    fixed fields and computes the ``derived`` ones with ``finish(fields) -> {derived: value}``.

    A ``mean`` field may be None (an output the options did not ask for): then in every batch. A field
    named here that the result does not have is skipped; a field of the result in none of the three
    groups must hold its default (None or the dataclass's) in every batch, else ``parts`` refuses, naming it.

    Example:
        >>> from rs_interp.heads import HeadAblationScan
        >>> parts, build = weighted(HeadAblationScan, mean=("effect", "clean", "ablated"), same=("ablation", "labels"))
        >>> r = HeadAblationScan(torch.ones(1, 1), 2.0, torch.ones(1, 1), "zero", ("L0H0",))
        >>> s = Sums()
        >>> s.add(*parts(r, 3.0))
        >>> build(s.totals, s.fixed, None).clean
        2.0
    """
    known = set(mean) | set(same) | set(derived)

    def parts(result: Any, weight: float) -> tuple[Parts, dict]:
        if not isinstance(result, cls):
            raise ValueError(f"expected a {cls.__name__}, got {type(result).__name__}")
        out: Parts = {"weight": torch.tensor(float(weight), dtype=torch.float64)}
        fixed: dict = {"kinds": {}}
        for f in dataclasses.fields(result):  # the result's own: a subclass's extra field is checked too
            v = getattr(result, f.name)
            if f.name in mean:
                if v is None:  # an output the options did not ask for (None in every batch: the kinds agree)
                    fixed["kinds"][f.name] = "none"
                    continue
                t, fixed["kinds"][f.name] = _as64(v, f"{type(result).__name__}.{f.name}")
                out[f.name] = weight * t
            elif f.name in same:
                fixed[f.name] = v
            elif f.name not in known and not _is_default(f, v):
                shown = f"a tensor of shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else f"{v!r:.60}"
                raise ValueError(f"{type(result).__name__}.{f.name} ({shown}): rs_interp.scale does not know how "
                                 "this field combines over batches, so it cannot return one call's result on the "
                                 "concatenated batch (a field at its default streams; declare this one in "
                                 "rs_interp.scale to stream it)")
        return out, fixed

    def build(totals: Parts, fixed: dict, model: Any) -> Any:
        w = totals["weight"]
        kinds = fixed["kinds"]
        values = {name: None if how == "none" else _back(totals[name] / w, how) for name, how in kinds.items()}
        values |= {name: decode(fixed[name], model) for name in same if name in fixed}
        if finish is not None:
            values |= finish(values)
        return cls(**values)

    return parts, build


def _is_default(f: dataclasses.Field, v: Any) -> bool:
    if v is None:
        return True
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
    if default is dataclasses.MISSING or isinstance(v, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    try:
        return bool(v == default)
    except (TypeError, ValueError, RuntimeError):  # a value with no plain equality is not a default
        return False
