"""Ground truth for circuit discovery (issue 31): models whose circuit is known, every method's
scores against it by AUROC, and the known circuit's own faithfulness.

The known circuits, in the edge layout of :mod:`rs_interp.circuits.graph`:

- ``tracr-*`` (:mod:`rs_interp.circuits.tracr`): read off the compiled weights, exactly
  (:func:`rs_interp.circuits.tracr.ground_truth_edges`). Scored on :func:`rs_interp.circuits.tracr_truth.tracr_case`:
  random valid inputs of the program's longest length, each paired with another random valid input of that length as the
  reference, with :func:`rs_interp.circuits.tracr_truth.tracr_metric`.
- ``induction-2l``: derived by :func:`rs_interp.circuits.induction_truth.induction_ground_truth` from evidence computed
on the model.
  The theory proposes the induction circuit (the token into the previous-token head's value, the
  previous-token head into the induction heads' keys by K-composition, the token into the
  induction heads' queries and values, the induction heads into the logits), the attention and
  composition scores pick its heads and edges, and circuit ablations (:func:`rs_interp.evaluate_circuit`)
  keep an edge only if leaving it out loses faithfulness, and measure what adding any other edge
  or head would gain.

**Which known edges carry effect.** Every method here patches from a reference run of the same
shape, and a known edge can be inert under such a patch, however essential to the computation
(:func:`rs_interp.circuits.tracr_truth.edge_classes`): the two runs may send the same along it (positions, the constant
``"one"`` and what is computed from the length alone, such as ``reverse``'s length and ``opp_idx``, are equal in any two
inputs of one length), or they differ but the receiver ignores the difference (``reverse``'s length head reads the
tokens through an always-true selector). In a compiled model the exact path patch gives every inert edge, and every edge
outside the known circuit, exactly 0: against the ``K`` known edges of which ``c`` carry effect its AUROC is ``(1 + c /
K) / 2``, and 1 against the ``c`` (:attr:`MethodScores.auroc_effective`).

**AUROC** (:func:`auroc`): the Mann-Whitney statistic of ``|score|``, the known items against the
others, ties counted half. Every model runs in float64 (:func:`as_float64`), and a score at most
:data:`NOISE_FLOOR` times the method's largest on that model counts as 0 (:func:`magnitudes`): a
gradient through tracr's saturated softmax or a discretising MLP is 1e-14 to 1e-21 of the largest
score in float64 (1e-10 to 1e-5 in float32: rounding noise), and it must not "rank" an edge above the exact zeros of the
edges outside the circuit. Node-level methods (attribution patching and the resample ablation scan, per head) are scored
over the heads, a head known when it sends a known edge (:func:`known_heads`).

>>> auroc([0.9, 0.5, 0.5, 0.1], [True, True, False, False])
0.875
>>> auroc([1.0, 2.0], [True, True]) is None    # one class only: undefined
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch
from jaxtyping import Int

from .. import _names as N
from .._backend import Model, per_head_inputs
from .._state import preserve_state
from ..exact.stream import mlp_flags, receiver_hook
from ..hooks import store_matching
from ..labels import edge_string
from ..metrics import Metric
from ..models.checkpoints import as_dtype
from ._substrate import record, sender_points, writes
from .evaluation import evaluate_circuit
from .graph import edge_layout
from .methods import METHODS

__all__ = [
    "NOISE_FLOOR",
    "FAINT",
    "GroundTruthCase",
    "MethodScores",
    "auroc",
    "magnitudes",
    "as_float64",
    "receiver_response",
    "known_heads",
    "score_methods",
    "missed",
    "faithfulness",
    "counted_flops",
]

#: A score at most this fraction of a method's largest counts as 0 (:func:`magnitudes`).
NOISE_FLOOR = 1e-9


# --- AUROC ------------------------------------------------------------------------------------------

def magnitudes(scores: Iterable[float]) -> list[float]:
    """``|score|``, with every value at most :data:`NOISE_FLOOR` times the largest set to 0.

    >>> magnitudes([-2.0, 1e-12, 0.5])
    [2.0, 0.0, 0.5]
    """
    m = [abs(float(s)) for s in scores]
    if any(math.isnan(v) for v in m):
        raise ValueError("scores contain NaN")
    top = max(m, default=0.0)
    return [v if v > NOISE_FLOOR * top else 0.0 for v in m]


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """The area under the ROC curve of ``scores`` for ``labels`` (True: positive): the probability
    that a random positive scores above a random negative, ties counted half (Mann-Whitney ``U``
    over ``n_pos * n_neg``, from mid-ranks). None when either class is empty.

    The scores are used as given; :func:`score_methods` passes :func:`magnitudes`.

    >>> auroc([3, 2, 1], [True, False, True])
    0.5
    """
    values = [float(s) for s in scores]
    labels = [bool(x) for x in labels]
    if any(math.isnan(v) for v in values):
        raise ValueError("scores contain NaN: an AUROC of NaN scores depends on their order")
    if len(values) != len(labels):
        raise ValueError(f"{len(values)} scores for {len(labels)} labels")
    n_pos = sum(labels)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # mid-ranks: a run of equal scores shares the mean of its ranks
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    u = sum(r for r, y in zip(ranks, labels) if y) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


# --- the runs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroundTruthCase:
    """One model with a known circuit and the run its methods are scored on.

    Attributes:
        name: the model (``"tracr-sort"``, ``"induction-2l"``).
        model: the model, in float64 (:func:`as_float64`).
        tokens, reference: (batch, pos) the run and its reference run (row ``b`` pairs with row ``b``).
        metric: a differentiable :data:`rs_interp.Metric` of the logits.
        known: the known circuit, ``(sender, receiver)`` edges.
        effective: the known edges that carry effect under the patch: their receiver's own output
            changes when the edge alone is patched (:func:`edge_classes`).
        inert: the other known edges, each with why it carries nothing under the patch.
        metric_description: what ``metric`` is, in words.
        spans: the spans the positional methods score (``"each"``, or a
            :class:`rs_interp.circuits.positions.PositionSchema` of ``tokens``).
    """

    name: str
    model: Model
    tokens: Int[torch.Tensor, "batch pos"]
    reference: Int[torch.Tensor, "batch pos"]
    metric: Metric
    known: frozenset[tuple[str, str]]
    effective: frozenset[tuple[str, str]]
    inert: Mapping[tuple[str, str], str]
    metric_description: str
    spans: Any = "each"


def as_float64(model: Model) -> Model:
    """A float64 copy of ``model`` (:func:`rs_interp.as_dtype`): every method here runs in float64.

    In float32 a gradient through tracr's saturated softmax comes out as rounding noise of up to
    1e-5 of the largest score, which no threshold separates reliably from a small true gradient;
    in float64 it is 1e-14 or below, and the true ones are above 1e-4 (measured on every model).
    """
    return as_dtype(model, torch.float64)


def _output_point(receiver: str, n_layers: int) -> tuple[str | None, int | None]:
    """The hook holding a receiver's own output (a head's ``z``, an MLP's output; None: the logits)."""
    if receiver == "logits":
        return None, None
    if receiver.startswith("MLP"):
        return N.mlp_out(int(receiver[3:])), None
    layer, _, index = receiver_hook(receiver, n_layers)
    return N.z(layer), index


def receiver_response(model: Model, tokens: torch.Tensor, reference: torch.Tensor,
                      edges: Iterable[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Per edge ``(s, r)``: how much the receiver's own output moves (largest absolute change over
    the batch, positions and units) when that edge alone is patched from ``reference`` (``r``'s
    input gets ``write_ref_s - write_s``): a head's ``z``, an MLP's output, the logits. Local: it
    says whether ``r`` reads what the edge brings, not whether the metric cares.

    >>> from rs_interp.models import make_attn_only
    >>> model = make_attn_only(2, n_heads=1)
    >>> a, b = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6]])
    >>> receiver_response(model, a, b, [("embed", "L0H0.v")])[("embed", "L0H0.v")] > 0
    True
    """
    cfg = model.cfg
    layout = edge_layout(model)
    edges = [tuple(e) for e in edges]
    for e in edges:
        layout.index(e)  # a ValueError for an unknown label or a pair that is not an edge
    points = sender_points(model)
    out: dict[tuple[str, str], float] = {}
    with preserve_state(model, **mlp_flags(model)), torch.no_grad():
        run, ref = record(model, tokens, points), record(model, reference, points)
        delta = writes(model, ref, run)  # (sender, batch, pos, d_model), float64, layout order
        clean: dict[str, torch.Tensor] = {}
        outputs = {_output_point(r, cfg.n_layers)[0] for _, r in edges} - {None}
        with model.hooks(fwd_hooks=store_matching(clean, model, lambda n: n in outputs)):
            clean_logits = model(tokens, return_type="logits")
        for s, r in edges:
            _, name, index = receiver_hook(r, cfg.n_layers)
            add = delta[layout.senders.index(s)]

            def patch(t: torch.Tensor, *, hook, add: torch.Tensor = add, index: int | None = index) -> torch.Tensor:
                t = t.clone()
                if index is None:
                    t += add.to(t.dtype)
                else:  # a per-head input (batch, pos, head, d_model)
                    t[:, :, index] += add.to(t.dtype)
                return t

            point, head = _output_point(r, cfg.n_layers)
            box: dict[str, torch.Tensor] = {}
            keep = store_matching(box, model, lambda n, point=point: n == point)
            with per_head_inputs(model, [(name, patch)]) as runnable, model.hooks(fwd_hooks=runnable + keep):
                logits = model(tokens, return_type="logits")
            if point is None:
                moved = logits - clean_logits
            else:
                moved = box[point] - clean[point]
                moved = moved if head is None else moved[:, :, head]
            out[(s, r)] = float(moved.abs().max())
    return out


# --- scoring the methods ----------------------------------------------------------------------------

def known_heads(model: Model, edges: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The heads (``"L0H1"``) that send an edge of ``edges``: the node-level ground truth.

    >>> from rs_interp.models import make_attn_only
    >>> sorted(known_heads(make_attn_only(2), [("L0H1", "L1H0.k"), ("embed", "L1H1.q")]))
    ['L0H1']
    """
    heads = [s for s in edge_layout(model).senders if s.startswith("L")]
    senders = {s for s, _ in edges}
    return frozenset(h for h in heads if h in senders)


@dataclass(frozen=True)
class MethodScores:
    """One method's scores on one case, scored against the known circuit.

    Attributes:
        method: its name in :data:`rs_interp.circuits.methods.METHODS`.
        items: the scored items, edges ``"s -> r"`` (:func:`rs_interp.labels.edge_string`; every edge of
            the layout) or heads ``"L0H1"``.
        scores: the method's number per item (signed, before :func:`magnitudes`).
        known: per item, whether it is in the known circuit (edges) or sends a known edge (heads).
        effective: per item, whether it is a known edge that carries effect under the patch (heads:
            sends one).
        auroc: AUROC of :func:`magnitudes` of ``scores``, the known items against the others (None:
            one class is empty).
        auroc_effective: the same with the known items that carry no effect left out.
        flops: the matmul FLOPs of the method's run (PyTorch's count; forward, backward and patched passes alike).
    """

    method: str
    items: tuple[str, ...]
    scores: tuple[float, ...]
    known: tuple[bool, ...]
    effective: tuple[bool, ...]
    auroc: float | None
    auroc_effective: float | None
    flops: int | None = None


def _scored(method: str, items: Sequence[str], values: Sequence[float], known: Sequence[bool],
            effective: Sequence[bool], flops: int | None = None) -> MethodScores:
    mags = magnitudes(values)
    keep = [e or not k for k, e in zip(known, effective)]  # leave out the known items that carry nothing
    return MethodScores(method, tuple(items), tuple(float(v) for v in values), tuple(known), tuple(effective),
                        auroc(mags, known),
                        auroc([m for m, k in zip(mags, keep) if k], [e for e, k in zip(effective, keep) if k]), flops)


class _Global:
    """FlopCounterMode's module tracker, replaced: every FLOP counted as the whole call's. Its own tracker registers
    PyTorch's global module hooks, which are part of the certificate's key (:func:`rs_interp.certify`), so every
    counted call would measure the model's certificate again (a second of CPU on a toy model). PyTorch 2.13's
    ``FlopCounterMode.mod_tracker``; remove when its counter can run without module tracking."""

    parents = {"Global"}

    def __enter__(self) -> "_Global":
        return self

    def __exit__(self, *args: Any) -> None:
        return None


def counted_flops(fn) -> tuple[Any, int]:
    """``fn()`` and the matmul FLOPs it ran (PyTorch's FlopCounterMode, forward and backward passes alike), counted
    without module hooks (:class:`_Global`)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _Global()
    with counter:
        out = fn()
    return out, int(counter.get_total_flops())


def score_methods(case: GroundTruthCase, *, progress: bool = True,
                  counted: Iterable[str] = ()) -> dict[str, MethodScores]:
    """Every registered method's scores on ``case`` (:data:`rs_interp.circuits.methods.METHODS`) and
    their AUROCs, keyed by method name: the edge methods over every edge of the layout, the node
    methods over every head, the positional methods over every positional edge (``"s -> r @ span"``; a
    positional edge is known, or carries effect, when its edge does: the known circuits say nothing of positions).
    The methods whose keys are in ``counted`` have their matmul FLOPs counted (``flops``; counting slows a run)."""
    counted = set(counted)
    model, tokens, reference, metric = case.model, case.tokens, case.reference, case.metric
    layout = edge_layout(model)
    edges = layout.edges()
    items = tuple(edge_string(e) for e in edges)
    heads = [s for s in layout.senders if s.startswith("L")]
    known, effective = known_heads(model, case.known), known_heads(model, case.effective)
    out = {}
    for name, method in METHODS.items():
        kw = {"spans": case.spans} if method.level == "positional" else {}
        run = lambda: method.run(model, tokens, metric, reference=reference, progress=progress, **kw)  # noqa: E731
        result, flops = counted_flops(run) if method.key in counted else (run(), None)
        if method.level == "positional":
            triples = result.edges()
            out[name] = _scored(name, tuple(f"{edge_string((s, r))} @ {u}" for s, r, u in triples),
                                result.effect[result.exists].tolist(), [(s, r) in case.known for s, r, _ in triples],
                                [(s, r) in case.effective for s, r, _ in triples], flops)
        elif method.level == "edge":
            out[name] = _scored(name, items, result.effect[layout.exists].tolist(), [e in case.known for e in edges],
                                [e in case.effective for e in edges], flops)
        else:
            by_label = dict(zip(result.labels, result.effect.flatten().tolist()))
            out[name] = _scored(name, heads, [by_label[h] for h in heads], [h in known for h in heads],
                                [h in effective for h in heads], flops)
    return out


#: A found item whose estimate is below this fraction of the exact effect is reported as faint.
FAINT = 0.01


def missed(scores: MethodScores, exact: MethodScores | None = None) -> list[dict[str, Any]]:
    """The known items that carry effect and that the method misses: ``"outranked"``, not ranked
    above every item outside the known circuit (what keeps ``auroc_effective`` below 1), with the
    outside item that scores highest; or, given the exact scores of the same items, ``"faint"``:
    ranked above them but at under :data:`FAINT` of the exact effect's size."""
    mags = magnitudes(scores.scores)
    outside = [(m, i) for i, (m, k) in enumerate(zip(mags, scores.known)) if not k]
    top, top_i = max(outside) if outside else (-1.0, None)
    out = []
    for i, (item, value, m, e) in enumerate(zip(scores.items, scores.scores, mags, scores.effective)):
        if not e:
            continue
        row = {"item": item, "score": value} | ({"exact": exact.scores[i]} if exact is not None else {})
        if m <= top:
            out.append(row | {"how": "outranked", "outranked_by": scores.items[top_i],
                              "outranked_by_score": scores.scores[top_i]})
        elif exact is not None and abs(value) < FAINT * abs(exact.scores[i]):
            out.append(row | {"how": "faint"})
    return out


def faithfulness(case: GroundTruthCase, circuit: Iterable[tuple[str, str]]) -> float:
    """``(m(circuit) - m(empty)) / (m(full) - m(empty))`` on the case's pairs, every edge outside
    ``circuit`` resample-ablated (:func:`rs_interp.evaluate_circuit`)."""
    run = lambda c: evaluate_circuit(case.model, case.tokens, case.metric, c, reference=case.reference)  # noqa: E731
    full, empty = run(edge_layout(case.model).edges()), run([])
    return (run(circuit) - empty) / (full - empty)


