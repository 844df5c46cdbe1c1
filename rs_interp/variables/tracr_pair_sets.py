"""Pair sets of the shipped tracr programs: interchanges of one RASP variable between two inputs, each read at
every output position where the program's counterfactual is defined (:mod:`rs_interp.variables.tracr_models`
gives the programs as causal models and where tracr put each variable).

>>> pairs = tracr_pairs("tracr-hist", "hist_1", n=4, seed=0)
>>> pairs.variable, pairs.n_classes, bool((pairs.base_positions >= 1).all())   # position 0 is the BOS
('hist_1', 6, True)
"""

from __future__ import annotations

import functools
import random
from typing import Any, Callable, Literal, Sequence

import torch

from ..circuits.tracr import metadata, program_name
from ..exact.validate import as_int
from .pairs import PairSet
from .tracr_models import Value, tracr_causal_model, tracr_inputs

__all__ = ["tracr_pairs"]


def _encode(program: str, xs: Sequence[Sequence[Value]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, max length + 1) token ids, BOS first, right-padded with PAD; and each row's length."""
    meta = metadata(program)
    ids = meta.token_id
    width = 1 + max(len(x) for x in xs)
    rows = [[ids[meta.bos]] + [ids[t] for t in x] + [ids[meta.pad]] * (width - 1 - len(x)) for x in xs]
    return torch.tensor(rows, dtype=torch.long), torch.tensor([1 + len(x) for x in xs], dtype=torch.long)


def _classes(program: str, outputs: set, n: int) -> tuple[Callable[[Value], int], dict[str, torch.Tensor]]:
    """The class of an output value, and the readout of ``n`` rows: every logit (categorical) or the values
    (numerical)."""
    meta = metadata(program)
    if meta.output == "categorical":
        values = list(meta.output_values)
        return values.index, {"candidates": torch.arange(len(values)).expand(n, -1)}
    values = sorted(outputs)
    return values.index, {"values": torch.tensor(values, dtype=torch.float64)}


def tracr_pairs(name: str, variable: str, *, n: int = 32, seed: int = 0, lengths: Sequence[int] | None = None,
                same_length: bool = False, every_position: bool = False,
                mix: Literal["mixed", "aligned", "several"] = "mixed", changed_only: bool = False) -> PairSet:
    """``n`` random interchanges of ``variable`` on the shipped program ``name``, each read at every output
    position where the counterfactual is defined (one row per read).

    A pair is a source input and position ``q`` whose value of the variable is drawn uniformly among the
    values it takes (so that every value is exercised, rare ones too), and a base input and position ``p``
    where the value differs (inputs of ``lengths``, default every length; the base as long as the source
    with ``same_length``); the base's variable at ``p`` takes the source's at ``q``. With ``every_position``
    the source is as long as the base and the variable's whole value is the source's (the interchange acts
    at every position, BOS included). ``several`` marks the pairs where variables other than the aligned one
    and those computed from it differ too (at ``p`` and ``q``); ``mix`` keeps both (``"mixed"``) or one.
    ``changed_only`` keeps only the reads whose counterfactual output differs from the base's (the rows that
    test the variable's effect, not its absence). Drawn by ``random.Random(seed)``.

    Raises:
        ValueError: an unknown program, variable or mix, or fewer than ``n`` pairs in ``100 * n`` draws.

    >>> pairs = tracr_pairs("tracr-sort", "target_pos_3", n=8, seed=0)
    >>> pairs.variable, pairs.n_classes, int(pairs.base_positions.min()) >= 1   # position 0 is the BOS
    ('target_pos_3', 4, True)
    """
    program, cm = program_name(name), tracr_causal_model(name)
    cm.variable(variable)
    if mix not in ("mixed", "aligned", "several"):
        raise ValueError(f"mix must be 'mixed', 'aligned' or 'several', got {mix!r}")
    others = set(cm.names) - {variable} - cm.descendants(variable)
    rng, inputs = random.Random(as_int("seed", seed)), tuple(tracr_inputs(program, lengths))
    rows: list[tuple] = []
    found = 0
    for _ in range(100 * as_int("n", n)):
        if found == n:
            break
        b, s, at = (_whole(program, variable, inputs, rng) if every_position
                    else _one(program, variable, inputs, rng, same_length))
        if b is None:
            continue
        several = bool(others & set(cm.differing(b, s, at=at)))
        if mix != "mixed" and several != (mix == "several"):
            continue
        out, cf = _run(program, b)[cm.output], cm.counterfactual(b, s, variable, at=at)
        rows += [(b, s, None if at is None else at[0], None if at is None else at[1], r, out[r], cf[r], several)
                 for r in range(len(b)) if out[r] is not None and cf[r] is not None
                 and not (changed_only and cf[r] == out[r])]
        found += 1
    if found < n:
        raise ValueError(f"only {found} of {n} {mix} pairs of {variable} with differing values were found in "
                         f"{100 * n} draws")
    return _pair_set(program, variable, rows)


@functools.lru_cache(maxsize=64)
def _by_value(program: str, variable: str, inputs: tuple) -> dict[Any, list[tuple[tuple, int]]]:
    """``{value: [(input, position), ...]}`` over ``inputs``, values in a fixed order."""
    out: dict[Any, list[tuple[tuple, int]]] = {}
    for x in inputs:
        for p, value in enumerate(_run(program, x)[variable]):
            if value is not None:
                out.setdefault(value, []).append((x, p))
    return dict(sorted(out.items(), key=lambda kv: repr(kv[0])))


def _one(program: str, variable: str, inputs: tuple, rng: random.Random, same_length: bool) -> tuple:
    """A source (input, position) of a uniformly drawn value, and a base (input, position) of another value."""
    by_value = _by_value(program, variable, inputs)
    value = rng.choice(list(by_value))
    s, q = rng.choice(by_value[value])
    b = rng.choice(inputs)
    if same_length and len(b) != len(s):
        return None, None, None
    p = rng.randrange(len(b))
    if _run(program, b)[variable][p] in (value, None):
        return None, None, None
    return b, s, (p, q)


def _whole(program: str, variable: str, inputs: tuple, rng: random.Random) -> tuple:
    """A base and a source as long, whose whole values of the variable differ."""
    b, s = rng.choice(inputs), rng.choice(inputs)
    if len(b) != len(s) or _run(program, b)[variable] == _run(program, s)[variable]:
        return None, None, None
    return b, s, None


@functools.lru_cache(maxsize=4096)
def _run(program: str, x: tuple) -> dict[str, Any]:
    return tracr_causal_model(program).run(x)


def _pair_set(program: str, variable: str, rows: list[tuple]) -> PairSet:
    cls, readout = _classes(program, {r[5] for r in rows} | {r[6] for r in rows}, len(rows))
    base, base_len = _encode(program, [r[0] for r in rows])
    source, source_len = _encode(program, [r[1] for r in rows])
    col = lambda i: torch.tensor([r[i] for r in rows], dtype=torch.long) + 1  # noqa: E731  (position 0: the BOS)
    every = rows[0][2] is None
    return PairSet(base=base, source=source, labels=torch.tensor([cls(r[6]) for r in rows]),
                   base_labels=torch.tensor([cls(r[5]) for r in rows]), read=col(4),
                   base_positions=None if every else col(2), source_positions=None if every else col(3),
                   base_lengths=base_len, source_lengths=source_len, several=torch.tensor([r[7] for r in rows]),
                   variable=variable, keys=tuple((r[1], r[3]) for r in rows), **readout)

