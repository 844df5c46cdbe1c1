"""Direct logit attribution and the lenses over a dataset: their summaries, summed and counted.

One call of :func:`rs_interp.direct_logit_attribution` or :func:`rs_interp.logit_lens` returns a number
per example and position, as large as the dataset; over a dataset these return what is read from it,
each a sum over positions divided by a count, both accumulated in float64:

- :func:`direct_logit_attribution` -> :class:`DLASummary`: each component's part of the metric, its
  mean over the scored positions (``DirectLogitAttribution.mean()`` of one call on every pair) and
  per position, and ``clean``;
- :func:`logit_lens` -> :class:`LensSummary`: per reading point the mean entropy, the mean probability
  of the target and how often it is the top token;
- :func:`lens_kl`: :func:`rs_interp.lens_kl` (a mean over every position; weight = positions).

A Task's target is its answer at the read position, its contrast the wrong id (one of each per row).

>>> import rs_interp as ri
>>> from rs_interp import scale
>>> from rs_interp.tasks import induction_task
>>> model, task = ri.load_toy_model("induction-2l"), induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
>>> lens = scale.logit_lens(model, task, batch_size=2, progress=False)
>>> lens.labels, lens.n_targets
(('embed', 'L0', 'L1'), 5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from .._backend import Model
from .._keywords import renamed
from .._messages import few
from ..exact.certificate import require
from ..exact.needs import needs
from ..metrics import top_effects
from ..readouts.attribution import direct_logit_attribution as _dla
from ..readouts.lens import logit_lens as _lens
from ..readouts.tuned_lens import TunedLens
from ..readouts.tuned_lens import lens_kl as _kl
from .engine import Analysis, no_overrides, quiet, stream
from .pairs import Dataset

__all__ = ["DLASummary", "LensSummary", "direct_logit_attribution", "logit_lens", "lens_kl"]

_STREAM = ("batch_size", "resume", "save_every", "progress", "kind")
F64 = torch.float64


@dataclass(frozen=True)
class DLASummary:
    """Direct logit attribution summed over a dataset (:func:`direct_logit_attribution`).

    Attributes:
        labels: the components, as :class:`rs_interp.readouts.DirectLogitAttribution` labels them.
        mean: (component,) each one's part of ``clean``: its mean over every scored position.
        by_position: (component, pos) its mean over the rows scored at each position (NaN where none is).
        clean: the metric (the target's logit difference) over every scored position.
        n_scored: the scored positions.
    """

    labels: tuple[str, ...]
    mean: Float[torch.Tensor, " component"]
    by_position: Float[torch.Tensor, "component pos"]
    clean: float
    n_scored: int

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` components with the largest ``|part of clean|``, with that part."""
        return top_effects(self.labels, self.mean, k)


@dataclass(frozen=True)
class LensSummary:
    """The logit lens summed over a dataset (:func:`logit_lens`).

    Attributes:
        labels: the reading points (``"embed"``, ``"L0"`` ...).
        entropy: (point,) the lens's mean entropy (nats) over every position.
        entropy_by_position: (point, pos) its mean over the rows at each position.
        target_prob: (point,) the target's mean probability over the positions with one (None without targets).
        accuracy: (point,) how often the target is the lens's top token there (None without targets).
        n_tokens: the positions read.
        n_targets: those with a target.
    """

    labels: tuple[str, ...]
    entropy: Float[torch.Tensor, " point"]
    entropy_by_position: Float[torch.Tensor, "point pos"]
    target_prob: Float[torch.Tensor, " point"] | None
    accuracy: Float[torch.Tensor, " point"] | None
    n_tokens: int
    n_targets: int

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` reading points where the target is most probable, with that probability.

        Raises:
            ValueError: the summary has no targets.
        """
        if self.target_prob is None:
            raise ValueError("this lens summary has no targets: top(k) ranks the reading points by the target's "
                             "probability")
        return top_effects(self.labels, self.target_prob, k)


def _targets(batch: Any, with_contrast: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The batch's (targets, contrast): a Task's answer (and wrong id) at the read position, -1 elsewhere."""
    task = batch.task
    if task is None:
        return batch.targets, batch.contrast
    for name in ("answers", "wrong") if with_contrast else ("answers",):
        ids = getattr(task, name)
        if bool(((ids >= 0).sum(1) != 1).any()):
            raise ValueError(f"the {task.name} task has several {name} in a row: a logit or probability is read for "
                             "one token (give Batch(tokens, targets=..., contrast=...) instead)")
    rows = torch.arange(len(task))
    out = []
    for ids in (task.answers, task.wrong) if with_contrast else (task.answers,):
        t = torch.full_like(task.clean, -1)
        t[rows, task.positions] = ids.max(1).values
        out.append(t)
    return out[0], out[1] if with_contrast else None


def _split(options: dict, helper: str, takes: tuple = ()) -> tuple[dict, dict]:
    no_overrides(options, helper, takes)
    return {k: options[k] for k in _STREAM if k in options}, {k: v for k, v in options.items() if k not in _STREAM}


@needs(like=_dla, name="scale.direct_logit_attribution")
def direct_logit_attribution(model: Model, data: Dataset, **options: Any) -> DLASummary:
    """:func:`rs_interp.direct_logit_attribution` over a dataset, summarised (module docstring).

    Args:
        data: a Task (target: each row's answer at its read position, contrast: its wrong id) or an
            iterable of :class:`rs_interp.scale.Batch` with ``targets`` (and ``contrast``).
        **options: ``batch_size``, ``resume``, ``save_every``, ``progress`` (:func:`rs_interp.scale.stream`).

    Raises:
        ValueError: a Task with several answers or wrong ids in a row, a batch without targets,
            no scored position in the dataset.

    Example:
        >>> import rs_interp as ri
        >>> from rs_interp.tasks import induction_task
        >>> model = ri.load_toy_model("induction-2l")
        >>> task = induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
        >>> dla = direct_logit_attribution(model, task, batch_size=2, progress=False)
        >>> dla.n_scored, abs(float(dla.mean.sum()) - dla.clean) < 1e-4   # the parts add up to the metric
        (5, True)
    """
    require(model, "scale.direct_logit_attribution")
    run_kw, options = _split(options, "direct_logit_attribution")
    if options:
        raise ValueError(f"direct_logit_attribution over a dataset takes no options beyond {_STREAM}, got "
                         f"{few(sorted(options))}")

    def run(model: Any, batch: Any) -> Any:
        targets, contrast = _targets(batch, True)
        if targets is None:
            raise ValueError("direct_logit_attribution needs each batch's targets (Batch(tokens, targets=...))")
        return _dla(model, batch.tokens, targets=targets, contrast=contrast, **quiet(_dla))

    def parts(r: Any, batch: Any) -> tuple[dict, dict]:
        c, scored = r.contributions.to(F64), r.scored
        return ({"sum": c[:, scored].sum(-1), "by_position": c.sum(1), "count": scored.sum().to(F64),
                 "position_count": scored.sum(0).to(F64), "clean": r.per_position.to(F64)[scored].sum()},
                {"labels": r.labels})

    def build(t: dict, fixed: dict, model: Any) -> DLASummary:
        n = t["count"]
        if float(n) == 0:
            raise ValueError("no position of the dataset has a target: nothing to attribute")
        return DLASummary(labels=tuple(fixed["labels"]), mean=t["sum"] / n,
                          by_position=t["by_position"] / t["position_count"], clean=float(t["clean"] / n),
                          n_scored=int(n))

    return stream(Analysis("direct logit attribution", run, parts, build, {}), model, data, **run_kw)


@needs(like=_lens, name="scale.logit_lens")
@renamed(top_k="k")
def logit_lens(model: Model, data: Dataset, **options: Any) -> LensSummary:
    """:func:`rs_interp.logit_lens` over a dataset, summarised (module docstring); the targets are a
    Task's answers at the read positions, or each Batch's ``targets`` (none: entropy only).

    Args:
        **options: ``batch_size``, ``resume``, ``save_every``, ``progress`` (:func:`rs_interp.scale.stream`);
            the rest (``sublayers``, ``memory_budget`` ...) pass to :func:`rs_interp.logit_lens`.
    """
    require(model, "scale.logit_lens")
    run_kw, options = _split(options, "logit_lens")
    if options.get("full"):
        raise ValueError("logit_lens over a dataset summarises; full=True (every distribution) is one call's, on one "
                         "batch")

    def run(model: Any, batch: Any) -> tuple[Any, Any]:
        targets, _ = _targets(batch, False)
        return _lens(model, batch.tokens, targets=targets, **{"k": 1, **options}, **quiet(_lens)), targets

    def parts(out: tuple, batch: Any) -> tuple[dict, dict]:
        r, targets = out
        ent = r.entropy.to(F64)
        p = {"entropy": ent.sum((1, 2)), "entropy_by_position": ent.sum(1),
             "rows": torch.tensor(float(ent.shape[1]), dtype=F64)}
        if targets is not None:
            scored = targets >= 0
            p["target_prob"] = r.target_probs.to(F64)[:, scored].sum(-1)
            p["hits"] = (r.top_tokens[..., 0] == targets.to(r.top_tokens.device)).to(F64)[:, scored].sum(-1)
            p["targets"] = scored.sum().to(F64)
        return p, {"labels": r.labels, "targets": targets is not None}

    def build(t: dict, fixed: dict, model: Any) -> LensSummary:
        rows, n_pos = t["rows"], t["entropy_by_position"].shape[1]
        has = fixed["targets"] and float(t["targets"]) > 0
        return LensSummary(labels=tuple(fixed["labels"]), entropy=t["entropy"] / (rows * n_pos),
                           entropy_by_position=t["entropy_by_position"] / rows,
                           target_prob=t["target_prob"] / t["targets"] if has else None,
                           accuracy=t["hits"] / t["targets"] if has else None,
                           n_tokens=int(rows) * n_pos, n_targets=int(t["targets"]) if fixed["targets"] else 0)

    return stream(Analysis("logit lens", run, parts, build, options), model, data, **run_kw)


@needs(like=_kl, name="scale.lens_kl")
def lens_kl(model: Model, data: Dataset, tuned: TunedLens | None = None,
            **options: Any) -> Float[torch.Tensor, " point"]:
    """:func:`rs_interp.lens_kl` over a dataset: ``KL(p_final || lens)`` at every reading point but the
    last, the mean over every position of every batch (the logit lens, or ``tuned``).

    Args:
        **options: ``batch_size``, ``resume``, ``save_every``, ``progress``; ``strict`` passes to
            :func:`rs_interp.lens_kl`.
    """
    require(model, "scale.lens_kl")
    run_kw, options = _split(options, "lens_kl")

    def parts(kl: torch.Tensor, batch: Any) -> tuple[dict, dict]:
        w = float(batch.tokens.numel())  # the helper's mean is over every (row, position)
        return {"kl": w * kl.to(F64), "weight": torch.tensor(w, dtype=F64)}, {}

    analysis = Analysis("lens KL", lambda model, batch: _kl(model, batch.tokens, tuned, **options, **quiet(_kl)), parts,
                        lambda t, fixed, model: t["kl"] / t["weight"], {"tuned": tuned, **options})
    return stream(analysis, model, data, **run_kw)
