"""The runs behind faithfulness curves (private, :mod:`rs_interp.circuits.evaluation`): the options of a curve as
one checked value, and every distinct circuit of several curves run once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .._backend import Model
from .._progress import bar
from .._state import preserve_state
from ..exact.stream import mlp_flags
from ..exact.validate import Ablation
from ..metrics import Direction, Metric, direction, metric_value
from . import positions as pos
from ._ablated_run import ablated_writes, run_circuit
from .graph import EdgeEffects, EdgeLayout, edge_layout, embedding_of
from .selection import Ranking, circuit_at, mib_weights, prune


@dataclass(frozen=True)
class CurveOptions:
    """How the circuits of a curve are evaluated (checked arguments of :func:`rs_interp.faithfulness_curve` and
    :func:`rs_interp.mib_scores`).

    Raises:
        ValueError: ``higher_is_better`` not True, False or None (checked before any run).
    """

    reference: torch.Tensor | None
    fractions: list[float]
    ablation: Ablation
    pruned: bool
    higher_is_better: bool | None
    progress: bool

    def __post_init__(self) -> None:
        if self.higher_is_better is not None and not isinstance(self.higher_is_better, bool):
            raise ValueError(f"higher_is_better must be True, False or None (from the metric), got "
                             f"{self.higher_is_better!r}")


@dataclass(frozen=True)
class CircuitValues:
    """What the curves of :func:`run_circuits`' requests are built from.

    Attributes:
        layout: the graph the scores are on; ``weights``: each edge's MIB weight (its count).
        clean, empty: the metric of the run and of the empty circuit; ``way``: the metric's direction.
        chosen: per request, per fraction, the edges picked (before pruning); ``circuits``: the circuits run.
        values: per request, per fraction, the metric of its circuit.
    """

    layout: EdgeLayout
    weights: torch.Tensor
    clean: float
    empty: float
    way: Direction
    chosen: list[list[torch.Tensor]]
    circuits: list[list[torch.Tensor]]
    values: list[list[float]]


def _layout_of(model: Model, requests: Sequence[tuple[EdgeEffects, Ranking]]) -> tuple[EdgeLayout, bool]:
    """The graph every request's scores are on, and whether they are positional (refused where they differ)."""
    first = requests[0][0]
    embedding = embedding_of(first.layout) if isinstance(first, (EdgeEffects, pos.PositionalEdgeEffects)) else "sum"
    layout = edge_layout(model, embedding)
    positional = isinstance(first, pos.PositionalEdgeEffects)
    kind = pos.PositionalEdgeEffects if positional else EdgeEffects
    for scores, _ranking in requests:
        if (not isinstance(scores, kind) or scores.layout.senders != layout.senders
                or scores.layout.receivers != layout.receivers):
            raise ValueError(f"scores must be edge scores ({kind.__name__}) of this model's edge layout (all on the "
                             "same input senders)")
        if positional and scores.spans != first.spans:
            raise ValueError("positional scores compared in one call must share their spans")
    return layout, positional


def run_circuits(model: Model, tokens: torch.Tensor, metric: Metric, requests: Sequence[tuple[EdgeEffects, Ranking]],
                 options: CurveOptions) -> CircuitValues:
    """Every request's circuits at ``options.fractions``, each distinct circuit (by its kept edges) run once
    (:func:`rs_interp.circuits.evaluation._curves`), the ablated writes, the clean and the empty run shared."""
    layout, positional = _layout_of(model, requests)
    first = requests[0][0]
    if positional:
        choose, pruner, weights, masks = pos.curve_rules(first, layout, tokens)
    else:
        choose, pruner, weights, masks = circuit_at, prune, mib_weights(layout), None
    nobody = torch.zeros_like(weights, dtype=torch.bool)
    with preserve_state(model, **mlp_flags(model)), torch.no_grad():
        ablated = ablated_writes(model, tokens, options.reference, options.ablation, embedding_of(layout))
        clean = metric_value(metric(model(tokens, return_type="logits")), "clean run")
        empty = run_circuit(model, tokens, metric, layout, nobody, ablated, "empty circuit", masks=masks)
        if clean == empty:
            raise ValueError(f"the clean run and the empty circuit give the same metric ({clean}): faithfulness is "
                             "undefined")
        way = direction(metric, clean, empty, options.higher_is_better)
        chosen = [[choose(scores, f, ranking=ranking, pruned=False, higher_is_better=way.higher_is_better)
                   for f in options.fractions] for scores, ranking in requests]
        circuits = [[pruner(layout, keep) if options.pruned else keep for keep in curve] for curve in chosen]
        key = lambda keep: bytes(keep.flatten().tolist())  # noqa: E731  (the kept edges, as bytes)
        distinct: dict[bytes, torch.Tensor] = {}
        for keep in (k for curve in circuits for k in curve):
            if key(keep) != key(nobody):
                distinct.setdefault(key(keep), keep)
        value = {key(nobody): empty}
        for k, keep in bar(distinct.items(), desc="faithfulness curve", enabled=options.progress, unit="circuit"):
            value[k] = run_circuit(model, tokens, metric, layout, keep, ablated, f"circuit of {int(keep.sum())} edges",
                                   masks=masks)
    values = [[value[key(keep)] for keep in curve] for curve in circuits]
    return CircuitValues(layout, weights, clean, empty, way, chosen, circuits, values)
