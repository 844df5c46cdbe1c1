"""Exact path patching: the measured change of a metric for each edge of the model's graph.

For the edge ``(s, r)`` the receiver ``r``'s input alone gets the sender's write from the reference
run (``input_r + write_ref_s - write_s``); every other reader sees the run's own write, and
everything downstream of ``r`` is recomputed. The effect is ``metric(patched) - metric(run)``, in
the layout of :func:`rs_interp.edge_layout` (the estimate :func:`rs_interp.edge_attribution_patching`
gives to first order).

The stream entering the receiver's layer is the run's own (nothing upstream of the receiver
changes), so each patched pass starts there from one cached clean pass (where the certificate's
``start at layer`` holds; else from the tokens); the edges into one receiver layer, whatever their
receivers there, are stacked along the batch (where its ``rows`` holds; else one per pass), as many
per pass as fit ``memory_budget``: each copy patches its own edge's receiver alone.

>>> from rs_interp import load_toy_model, induction_batch, next_token_loss
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(4, seed=0), induction_batch(4, seed=1)
>>> pp = path_patching(model, a.tokens, next_token_loss(a.targets), reference=b.tokens)
>>> tuple(pp.effect.shape), int((~pp.effect.isnan()).sum()) == pp.layout.n_edges
((5, 13), True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Int

from .. import _names as N
from .._backend import Model, run_from
from .._budget import MEMORY_BUDGET, stacked_copies
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import EDGES, ONE_PASS_EACH, needs
from ..exact.stream import mlp_flags, receiver_hook, routed, stacked_start, start_points
from ..exact.validate import check_int_range
from ..hooks import store_matching
from ..metrics import Metric, metric_value
from ._substrate import check_pair, record, sender_points, writes
from .graph import EdgeEffects, EdgeLayout, edge_layout
from .positions import Positional, PositionSchema, resolve_spans

__all__ = ["PathPatching", "path_patching"]


@dataclass(frozen=True)
class PathPatching(EdgeEffects, Positional):
    """Measured edge effects (:class:`rs_interp.EdgeEffects`: ``layout``, ``effect`` (sender,
    receiver), NaN where there is no edge or it was not asked for, ``clean``, ``.edge``, ``.top``).

    Attributes:
        per_span: (sender, receiver, span) with ``spans=``: each edge patched at one span's positions
            alone (exact; these need not add up to ``effect``, the edge patched at every position at once).
        schema: the :class:`rs_interp.circuits.positions.PositionSchema` of ``per_span``.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> pp = rs_interp.path_patching(model, a, metric, reference=b, edges=[("embed", "logits")])
        >>> abs(pp.clean - float(metric(model(a)).detach())) < 1e-5
        True
    """

    per_span: torch.Tensor | None = None
    schema: PositionSchema | None = None


@dataclass(frozen=True)
class Prepared:
    """What every patched pass of one run shares: the run's metric, its stream entering each layer (and what a pass
    started there reads: :func:`rs_interp.exact.stream.start_points`, the middle of each block and the final stream
        too),
    and each sender's exact write change (sender, batch, pos, d_model), float64 (:func:`._substrate.writes`
    ``patched``)."""

    clean: float
    box: dict
    delta: torch.Tensor


def prepare(model: Model, tokens: torch.Tensor, reference: torch.Tensor, metric: Metric) -> Prepared:
    """One no-grad pass on ``reference`` and one on ``tokens`` (:class:`Prepared`); the caller holds "
    "``preserve_state``."""
    points = sender_points(model)
    L = model.cfg.n_layers
    starts = start_points(model)
    streams = {N.resid_mid(l) for l in range(L)} | {N.final_stream(L)}
    ref = record(model, reference, points)
    run: dict[str, torch.Tensor] = {}
    box: dict[str, torch.Tensor] = {}
    stored = store_matching(run, model, points) + store_matching(box, model, lambda n: starts(n) or n in streams)
    with model.hooks(fwd_hooks=stored):
        clean = metric_value(metric(model(tokens, return_type="logits")), "clean run")
    return Prepared(clean, box, writes(model, ref, run, patched=True))


def measure(model: Model, tokens: torch.Tensor, metric: Metric, run: Prepared, items: list, cert, memory_budget: int,
            progress: bool, schema: PositionSchema | None = None) -> dict[tuple, float]:
    """The exact change of the metric for each item ``(sender row, receiver column, span index or None)``: the sender's
    write change added to the receiver's input alone (at the span's positions only). The items into one receiver layer
    share a pass, stacked along the batch where the certificate's ``rows`` holds (as many as ``memory_budget``
    allows), each pass started at that layer where ``start at layer`` holds (else from the tokens)."""
    cfg = model.cfg
    layout = edge_layout(model)
    B, P = tokens.shape
    from_layer = cert.holds("start at layer")
    per_pass = stacked_copies(model, B, P, memory_budget) if cert.holds("rows") else 1
    delta = run.delta
    masks = None if schema is None else schema.one_hot(delta.dtype).permute(2, 0, 1)[..., None]  # (span, batch, pos, 1)
    by_layer: dict[int, list[tuple[int, int, int | None]]] = {}
    for row, j, u in items:
        by_layer.setdefault(receiver_hook(layout.receivers[j], cfg.n_layers)[0], []).append((row, j, u))
    jobs = [(layer, edges[i : i + per_pass]) for layer, edges in sorted(by_layer.items())
            for i in range(0, len(edges), per_pass)]
    out = {}
    for layer, pairs in bar(jobs, desc="path patching", enabled=progress, unit="pass"):
        k = len(pairs)
        # hook -> (replica, head index, what is added)
        targets: dict[str, list[tuple[int, int | None, torch.Tensor]]] = {}
        for i, (row, j, u) in enumerate(pairs):
            _, name, index = receiver_hook(layout.receivers[j], cfg.n_layers)
            targets.setdefault(name, []).append((i, index, delta[row] if u is None else delta[row] * masks[u]))

        def patch_of(entries: list[tuple[int, int | None, torch.Tensor]]):
            def patch(t: torch.Tensor, *, hook) -> torch.Tensor:
                t = t.clone()
                for i, index, add in entries:
                    if index is None:
                        t[i * B : (i + 1) * B] += add.to(t.dtype)
                    else:  # a per-head input (batch, pos, head or kv_head, d_model)
                        t[i * B : (i + 1) * B, :, index] += add.to(t.dtype)
                return t
            return patch

        x, start, spe = stacked_start(model, tokens, run.box, layer, k, from_layer)
        # always split (3.x's per-head inputs on for every pass: the numbers do not depend on the receivers' kind)
        patches = [(name, patch_of(e)) for name, e in targets.items()]
        with routed(model, patches, split=True) as runnable, model.hooks(fwd_hooks=runnable):
            logits = run_from(model, x, start=start, spe=spe)
        for i, (row, j, u) in enumerate(pairs):
            what = f"edge {layout.senders[row]} -> {layout.receivers[j]}" + (
                "" if u is None else f" at span {schema.names[u]}")
            out[(row, j, u)] = metric_value(metric(logits[i * B : (i + 1) * B]), what) - run.clean
    return out


def _wanted(layout: EdgeLayout, edges: Sequence[tuple[str, str]] | None) -> torch.Tensor:
    if edges is None:
        return layout.exists.clone()
    mask = torch.zeros_like(layout.exists)
    for edge in edges:
        if not (isinstance(edge, (tuple, list)) and len(edge) == 2):
            raise ValueError(f"edges entries must be (sender, receiver) pairs, got {edge!r}")
        mask[layout.index(tuple(edge))] = True
    if not mask.any():
        raise ValueError("edges is empty; pass None for every edge")
    return mask


@needs(*EDGES, adapts=ONE_PASS_EACH)
def path_patching(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    edges: Sequence[tuple[str, str]] | None = None,
    spans: str | PositionSchema | None = None,
    memory_budget: int = MEMORY_BUDGET,
    progress: bool = True,
) -> PathPatching:
    """The exact effect of patching each edge (module docstring): every edge of the graph, or
    ``edges`` (``(sender, receiver)`` labels, e.g. ``[("L0H1", "L1H0.k")]``).

    Args:
        metric: a :data:`rs_interp.Metric` (a scalar function of the logits).
        reference: tokens of the reference run, the shape of ``tokens``.
        edges: the edges to measure (default: all); the others are NaN.
        spans: ``"each"`` or a :class:`rs_interp.circuits.positions.PositionSchema`: also each edge patched at
            each span alone (``per_span``; one more patched pass per edge and span).
        memory_budget: bytes one stacked pass may use (roughly); at least one edge per pass.
        progress: a progress bar over the passes.

    Raises:
        ValueError: bad tokens or reference, an unknown label or a pair that is not an edge, an
            empty ``edges``, or a metric that returns no number.

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> pp = path_patching(model, a, metric, reference=b, edges=[("L0H0", "L1H0.k"), ("embed", "logits")])
        >>> int((~pp.effect.isnan()).sum()), pp.layout.n_edges
        (2, 29)
    """
    tokens, reference = check_pair(model, tokens, reference)
    schema = resolve_spans(spans, tokens)
    check_int_range("memory_budget", memory_budget, 1)
    cert = require(model, "path_patching")
    layout = edge_layout(model)
    wanted = _wanted(layout, edges)
    effect = torch.full(wanted.shape, float("nan"), dtype=torch.float64)
    per_span = None if schema is None else torch.full((*wanted.shape, schema.n_spans), float("nan"),
                                                      dtype=torch.float64)
    with preserve_state(model, **mlp_flags(model)), torch.no_grad():
        run = prepare(model, tokens, reference, metric)
        # every edge patched at every position, then (with a schema) at each span alone
        items = [(row, j, None) for row, j in wanted.nonzero().tolist()]
        if schema is not None:
            items += [(row, j, u) for row, j in wanted.nonzero().tolist() for u in range(schema.n_spans)]
        measured = measure(model, tokens, metric, run, items, cert, memory_budget, progress, schema)
        for (row, j, u), moved in measured.items():
            if u is None:
                effect[row, j] = moved
            else:
                per_span[row, j, u] = moved
    clean = run.clean
    return PathPatching(layout=layout, effect=effect, clean=clean, per_span=per_span, schema=schema)
