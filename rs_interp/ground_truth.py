"""Ground truth for circuit discovery (issue 31): models whose circuit is known, every method's
scores against it by AUROC, and the known circuit's own faithfulness.

The known circuits, in the edge layout of :mod:`rs_interp.edges`:

- ``tracr-*`` (:mod:`rs_interp.tracr`): read off the compiled weights, exactly
  (:func:`rs_interp.tracr.ground_truth_edges`). Scored on :func:`tracr_case`: random valid inputs
  of the program's longest length, each paired with another random valid input of that length as
  the reference, with :func:`tracr_metric`.
- ``induction-2l``: derived by :func:`induction_ground_truth` from evidence computed on the model.
  The theory proposes the induction circuit (the token into the previous-token head's value, the
  previous-token head into the induction heads' keys by K-composition, the token into the
  induction heads' queries and values, the induction heads into the logits), the attention and
  composition scores pick its heads and edges, and circuit ablations (:func:`rs_interp.evaluate_circuit`)
  keep an edge only if leaving it out loses faithfulness, and measure what adding any other edge
  or head would gain.

**Which known edges carry effect.** Every method here patches from a reference run of the same
shape, and a known edge can be inert under such a patch, however essential to the computation
(:func:`edge_classes`): the two runs may send the same along it (positions, the constant ``"one"``
and what is computed from the length alone, such as ``reverse``'s length and ``opp_idx``, are
equal in any two inputs of one length), or they differ but the receiver ignores the difference
(``reverse``'s length head reads the tokens through an always-true selector). In a compiled
model the exact path patch gives every inert edge, and every edge outside the known circuit,
exactly 0: against the ``K`` known edges of which ``c`` carry effect its AUROC is
``(1 + c / K) / 2``, and 1 against the ``c`` (:attr:`MethodScores.auroc_effective`).

**AUROC** (:func:`auroc`): the Mann-Whitney statistic of ``|score|``, the known items against the
others, ties counted half. Every model runs in float64 (:func:`as_float64`), and a score at most
:data:`NOISE_FLOOR` times the method's largest on that model counts as 0 (:func:`magnitudes`): a
gradient through tracr's saturated softmax or a discretising MLP is 1e-14 to 1e-21 of the largest
score in float64 (1e-10 to 1e-5 in float32: rounding noise), and it must not "rank" an edge above the exact zeros of the edges
outside the circuit. Node-level methods (attribution patching and the resample ablation scan, per
head) are scored over the heads, a head known when it sends a known edge (:func:`known_heads`).

>>> auroc([0.9, 0.5, 0.5, 0.1], [True, True, False, False])
0.875
>>> auroc([1.0, 2.0], [True, True]) is None    # one class only: undefined
True
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch
from jaxtyping import Int

from . import tracr as _tracr
from ._backend import Model, per_head_inputs
from ._state import preserve_state
from .attribution_patching import _record, attribution_patching
from .circuits import evaluate_circuit
from .composition import composition_scores
from .copying import copying_scores
from .data import InductionBatch
from .edge_attribution import _sender_points, _writes, edge_attribution_patching
from .edges import EdgeEffects, edge_layout
from .head_ablation import head_ablation_scan
from .hooks import store_matching
from .heads import head_label, induction_scores, prev_token_scores
from .metrics import Metric, next_token_loss
from .models import as_dtype
from .path_patching import _receiver_point, path_patching

__all__ = [
    "NOISE_FLOOR",
    "NODE_METHODS",
    "GroundTruthCase",
    "MethodScores",
    "InductionGroundTruth",
    "auroc",
    "magnitudes",
    "tracr_metric",
    "tracr_case",
    "FAINT",
    "as_float64",
    "receiver_response",
    "edge_classes",
    "known_heads",
    "score_methods",
    "missed",
    "faithfulness",
    "induction_ground_truth",
    "induction_case",
]

#: A score whose magnitude is at most this fraction of the method's largest on the model counts as 0
#: (in float64: the vanishing gradients are below 1e-13 of it, the smallest real score above 1e-4).
NOISE_FLOOR = 1e-9
#: The node methods (per head): attribution patching and the exact resample ablation scan.
NODE_METHODS = ("attribution patching (heads)", "ablation scan (heads)")


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


def as_float64(model: Model) -> Model:
    """A float64 copy of ``model`` (:func:`rs_interp.as_dtype`): every method here runs in float64.

    In float32 a gradient through tracr's saturated softmax comes out as rounding noise of up to
    1e-5 of the largest score, which no threshold separates reliably from a small true gradient;
    in float64 it is 1e-14 or below, and the true ones are above 1e-4 (measured on every model).
    """
    return as_dtype(model, torch.float64)


def tracr_metric(name: str, inputs: Sequence[Sequence[Any]]) -> Metric:
    """The metric of a compiled program on ``inputs`` (equal-length sequences, without BOS), over
    the logits at the output positions (every position but the BOS), summed over them and averaged
    over the batch:

    - categorical programs: the log-probability of the program's correct output (from the plain
      Python :func:`rs_interp.tracr.reference`, not from the model). The compiled model's output
      logits are one-hot of size about 1, so this is far from saturated (about ``-0.6`` per
      position with three output values), and it moves whenever an output value does.
    - numerical programs: the output itself (the one logit, the value the program computes).
      Linear in the logits, so a patch moves it by exactly how much the computed values move; a
      squared error to the correct value would sit at its minimum on the clean run, where every
      gradient is 0 (the failure the attribution patching section shows with the loss).

    >>> metric = tracr_metric("frac_prevs", [["x", "y"]])
    >>> float(metric(torch.tensor([[[9.0], [1.0], [0.5]]])))   # 1.0 + 0.5: the BOS is dropped
    1.5
    """
    meta = _tracr.metadata(name)
    if meta.output == "numerical":
        def numerical(logits: torch.Tensor) -> torch.Tensor:
            x = logits if logits.dtype == torch.float64 else logits.float()
            return x[:, 1:, 0].sum(-1).mean()

        return numerical
    index = {v: i for i, v in enumerate(meta.output_values)}
    targets = torch.tensor([[index[y] for y in _tracr.reference(meta.name, x)] for x in inputs], dtype=torch.long)

    def categorical(logits: torch.Tensor) -> torch.Tensor:
        x = logits if logits.dtype == torch.float64 else logits.float()
        logp = x[:, 1:].log_softmax(-1)
        return logp.gather(-1, targets.to(logp.device)[..., None])[..., 0].sum(-1).mean()

    return categorical


def _output_point(receiver: str, n_layers: int) -> tuple[str | None, int | None]:
    """The hook holding a receiver's own output (a head's ``z``, an MLP's output; None: the logits)."""
    if receiver == "logits":
        return None, None
    if receiver.startswith("MLP"):
        return f"blocks.{receiver[3:]}.hook_mlp_out", None
    layer, _, index = _receiver_point(receiver, n_layers)
    return f"blocks.{layer}.attn.hook_z", index


def receiver_response(model: Model, tokens: torch.Tensor, reference: torch.Tensor,
                      edges: Iterable[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Per edge ``(s, r)``: how much the receiver's own output moves (largest absolute change over
    the batch, positions and units) when that edge alone is patched from ``reference`` (``r``'s
    input gets ``write_ref_s - write_s``): a head's ``z``, an MLP's output, the logits. Local: it
    says whether ``r`` reads what the edge brings, not whether the metric cares.

    >>> from rs_interp import make_attn_only
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
    points = _sender_points(model)
    flags = {} if cfg.attn_only else dict(use_hook_mlp_in=True)
    out: dict[tuple[str, str], float] = {}
    with preserve_state(model, **flags), torch.no_grad():
        run, ref = _record(model, tokens, points), _record(model, reference, points)
        delta = _writes(model, ref, run)  # (sender, batch, pos, d_model), float64, layout order
        clean: dict[str, torch.Tensor] = {}
        outputs = {_output_point(r, cfg.n_layers)[0] for _, r in edges} - {None}
        with model.hooks(fwd_hooks=store_matching(clean, model, lambda n: n in outputs)):
            clean_logits = model(tokens, return_type="logits")
        for s, r in edges:
            _, name, index = _receiver_point(r, cfg.n_layers)
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


def edge_classes(model: Model, name: str, tokens: torch.Tensor, reference: torch.Tensor, *,
                 tol: float = 1e-9) -> dict[tuple[str, str], tuple[str, str]]:
    """Each known edge of compiled model ``name``, classed by what a patch from ``reference`` does to it:

    - ``"same"``: the two runs write the same along it (the sender's write differs by at most
      ``tol`` on every residual direction the receiver reads): positions, the constant ``"one"``
      and whatever is computed from the length alone are equal in any two inputs of one length;
    - ``"ignored"``: they differ along it, yet the receiver's own output does not move when it is
      patched (:func:`receiver_response` at most ``tol``): the receiver's computation does not
      depend on the difference (an always-true selector reads the tokens it does not compare);
    - ``"effect"``: the receiver's output moves.

    Returns ``edge -> (class, what it carries)``: the residual labels both ends share, a variable
    by its name where it carries every value of it (``"indices"``), else with the values (``"tokens:BOS"``).

    >>> model = as_float64(_tracr.load_tracr_model("frac_prevs"))
    >>> a, b = _tracr.encode("frac_prevs", [["x", "y", "x"]]), _tracr.encode("frac_prevs", [["y", "y", "z"]])
    >>> classes = edge_classes(model, "frac_prevs", a, b)
    >>> classes[("embed", "L1H0.q")], classes[("MLP0", "L1H0.v")][0]
    (('same', 'indices, one'), 'effect')
    """
    meta = _tracr.metadata(name)
    layout = edge_layout(model)
    points = _sender_points(model)
    with torch.no_grad():
        delta = _writes(model, _record(model, reference, points), _record(model, tokens, points))
    position = {label: i for i, label in enumerate(meta.residual_labels)}
    classes, differing = {}, []
    for s, r in sorted(meta.edges):
        shared = sorted(meta.writes[s] & meta.reads[r], key=position.get)
        d = delta[layout.senders.index(s)][..., [position[label] for label in shared]]
        differs = bool(d.numel()) and float(d.abs().max()) > tol
        differing += [(s, r)] if differs else []
        classes[(s, r)] = ("effect" if differs else "same", _variables(shared, meta.residual_labels))
    for edge, moved in receiver_response(model, tokens, reference, differing).items():
        if moved <= tol:
            classes[edge] = ("ignored", classes[edge][1])
    return classes


def _variables(labels: Sequence[str], every: Sequence[str]) -> str:
    """Residual labels in words: a variable by its name where all its values are there, else with
    the values present (``"tokens:BOS"``), in the residual order."""
    values: dict[str, list[str]] = {}
    for label in labels:
        var, _, value = label.partition(":")
        values.setdefault(var, []).append(value)
    total = {}
    for label in every:
        total[label.partition(":")[0]] = total.get(label.partition(":")[0], 0) + 1
    return ", ".join(var if len(v) == total[var] else f"{var}:{'|'.join(v)}" for var, v in values.items())


def _inert_reason(edge: tuple[str, str], kind: str, carried: str) -> str:
    if kind == "same":
        return f"carries {carried}: the same in both runs (inputs of one length)"
    return f"carries {carried}, which differ between the runs, but {edge[1].split('.')[0]}'s output does not depend on the difference"


def tracr_case(name: str, *, n_pairs: int = 64, seed: int = 0) -> GroundTruthCase:
    """The run a compiled model's methods are scored on: ``n_pairs`` random inputs of the program's
    longest length (every position computes), each paired with another random input of that length
    as the reference (what a patch brings in), drawn from ``seed``; :func:`tracr_metric`; the known
    circuit from the weights, split by :func:`edge_classes`. The model runs in float64.

    >>> case = tracr_case("tracr-hist", n_pairs=4)
    >>> tuple(case.tokens.shape), len(case.known), sorted(case.inert)
    ((4, 6), 6, [('embed', 'L0H0.v'), ('embed', 'MLP0')])
    """
    meta = _tracr.metadata(name)
    rng = random.Random(f"ground-truth-{seed}-{meta.name}")
    draw = lambda: [[rng.choice(meta.vocab) for _ in range(meta.max_seq_len)] for _ in range(n_pairs)]  # noqa: E731
    inputs, others = draw(), draw()
    model = as_float64(_tracr.load_tracr_model(meta.name))
    tokens, reference = _tracr.encode(meta.name, inputs), _tracr.encode(meta.name, others)
    classes = edge_classes(model, meta.name, tokens, reference)
    what = ("log-probability of the correct output, summed over the output positions" if meta.output == "categorical"
            else "the output value, summed over the output positions")
    return GroundTruthCase(f"tracr-{meta.name}", model, tokens, reference, tracr_metric(meta.name, inputs),
                           _tracr.ground_truth_edges(meta.name), frozenset(e for e, (k, _) in classes.items() if k == "effect"),
                           {e: _inert_reason(e, k, c) for e, (k, c) in sorted(classes.items()) if k != "effect"}, what)


# --- scoring the methods ----------------------------------------------------------------------------

def known_heads(model: Model, edges: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The heads (``"L0H1"``) that send an edge of ``edges``: the node-level ground truth.

    >>> from rs_interp import make_attn_only
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
        method: its name (:data:`EDGE_METHODS`, :data:`NODE_METHODS`; EAP-IG with its ``m``).
        items: the scored items, edges ``"s -> r"`` (every edge of the layout) or heads ``"L0H1"``.
        scores: the method's number per item (signed, before :func:`magnitudes`).
        known: per item, whether it is in the known circuit (edges) or sends a known edge (heads).
        effective: per item, whether it is a known edge that carries effect under the patch (heads:
            sends one).
        auroc: AUROC of :func:`magnitudes` of ``scores``, the known items against the others (None:
            one class is empty).
        auroc_effective: the same with the known items that carry no effect left out.
    """

    method: str
    items: tuple[str, ...]
    scores: tuple[float, ...]
    known: tuple[bool, ...]
    effective: tuple[bool, ...]
    auroc: float | None
    auroc_effective: float | None


def _scored(method: str, items: Sequence[str], values: Sequence[float], known: Sequence[bool],
            effective: Sequence[bool]) -> MethodScores:
    mags = magnitudes(values)
    keep = [e or not k for k, e in zip(known, effective)]  # leave out the known items that carry nothing
    return MethodScores(method, tuple(items), tuple(float(v) for v in values), tuple(known), tuple(effective),
                        auroc(mags, known), auroc([m for m, k in zip(mags, keep) if k], [e for e, k in zip(effective, keep) if k]))


def score_methods(case: GroundTruthCase, *, ig_steps: int = 5, progress: bool = False) -> dict[str, MethodScores]:
    """Every method's scores on ``case`` and their AUROCs, keyed by method: EAP, EAP-IG with
    ``ig_steps`` points (``"EAP-IG (m = 5)"``) and exact path patching over every edge of the
    layout; attribution patching and the exact resample ablation scan over every head."""
    model, tokens, reference, metric = case.model, case.tokens, case.reference, case.metric
    edge_results: dict[str, EdgeEffects] = {
        "EAP": edge_attribution_patching(model, tokens, metric, reference=reference),
        f"EAP-IG (m = {ig_steps})": edge_attribution_patching(model, tokens, metric, reference=reference, ig_steps=ig_steps),
        "exact path patching": path_patching(model, tokens, metric, reference=reference, progress=progress),
    }
    layout = edge_layout(model)
    edges = layout.edges()
    items = tuple(f"{s} -> {r}" for s, r in edges)
    out = {method: _scored(method, items, r.effect[layout.exists].tolist(), [e in case.known for e in edges],
                           [e in case.effective for e in edges])
           for method, r in edge_results.items()}
    heads = [s for s in layout.senders if s.startswith("L")]
    known, effective = known_heads(model, case.known), known_heads(model, case.effective)
    node_results = {
        NODE_METHODS[0]: attribution_patching(model, tokens, metric, reference=reference),
        NODE_METHODS[1]: head_ablation_scan(model, tokens, metric, method="resample", reference=reference),
    }
    for method, r in node_results.items():
        by_label = dict(zip(r.labels, r.effect.flatten().tolist()))
        out[method] = _scored(method, heads, [by_label[h] for h in heads], [h in known for h in heads],
                              [h in effective for h in heads])
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
            out.append(row | {"how": "outranked", "outranked_by": scores.items[top_i], "outranked_by_score": scores.scores[top_i]})
        elif exact is not None and abs(value) < FAINT * abs(exact.scores[i]):
            out.append(row | {"how": "faint"})
    return out


def faithfulness(case: GroundTruthCase, circuit: Iterable[tuple[str, str]]) -> float:
    """``(m(circuit) - m(empty)) / (m(full) - m(empty))`` on the case's pairs, every edge outside
    ``circuit`` resample-ablated (:func:`rs_interp.evaluate_circuit`)."""
    run = lambda c: evaluate_circuit(case.model, case.tokens, case.metric, c, reference=case.reference)  # noqa: E731
    full, empty = run(edge_layout(case.model).edges()), run([])
    return (run(circuit) - empty) / (full - empty)


# --- induction-2l: the circuit from the evidence ----------------------------------------------------

@dataclass(frozen=True)
class InductionGroundTruth:
    """The induction circuit of a two-layer attention-only model, with the evidence for each edge.

    Attributes:
        edges: the circuit, ``(sender, receiver)`` in the edge layout.
        prev_token_heads: layer-0 heads whose mean weight on the previous token reaches the threshold.
        induction_heads: layer-1 heads whose mean weight on the induction target ``i - p + 1`` does.
        evidence: per edge of ``edges``, why it is there: its role, the scores that pick it, and the
            faithfulness lost when it alone is left out.
        leave_one_out: per edge, that loss.
        dropped: edges the theory proposed and the ablations removed, with their leave-one-out loss.
        faithfulness: the circuit's faithfulness.
        best_edge: the edge outside the circuit whose addition gains the most faithfulness, and the gain.
        best_head: the head outside the circuit whose addition with all its edges gains the most, and the gain.
        scores: the numbers behind the evidence (previous-token and induction weights, composition
            and copying scores).
    """

    edges: frozenset[tuple[str, str]]
    prev_token_heads: tuple[str, ...]
    induction_heads: tuple[str, ...]
    evidence: dict[tuple[str, str], str]
    leave_one_out: dict[tuple[str, str], float]
    dropped: dict[tuple[str, str], float]
    faithfulness: float
    best_edge: tuple[tuple[str, str] | None, float]
    best_head: tuple[str | None, float]
    scores: dict[str, Any]


def induction_ground_truth(model: Model, batch: InductionBatch, *, tokens: torch.Tensor, reference: torch.Tensor, metric: Metric,
                           prev_token_head: float, induction_head: float, necessary: float) -> InductionGroundTruth:
    """The induction circuit of a two-layer attention-only model, from evidence.

    The theory proposes (Definition 4, Proposition 5, "Induction heads"): a previous-token head
    ``P`` (layer 0, mean weight on ``i - 1`` at least ``prev_token_head`` over ``batch``) copies
    the previous token into the stream, ``(embed, P.v)``; its pattern is positional, so no edge into
    its query or key is proposed. An induction head ``I`` (layer 1, mean weight on the induction
    target ``i - p + 1`` at least ``induction_head``) finds, through its key, the position whose
    predecessor is the current token: ``(P, I.k)`` where ``P``'s K-composition score with ``I`` is
    above its Q- and V-composition scores; it queries with the current token, ``(embed, I.q)``,
    copies the token there, ``(embed, I.v)`` (its copying score is recorded), and writes the
    prediction, ``(I, logits)``.

    The ablations decide (resample, on the pairs ``tokens`` / ``reference``, with ``metric``,
    :func:`rs_interp.evaluate_circuit`): an edge stays only if leaving it out of the circuit loses
    at least ``necessary`` of the faithfulness (repeated until every edge passes); the gain of
    adding each edge outside, and each other head with every edge into and out of it, is recorded.

    Raises:
        ValueError: not a two-layer attention-only model, no previous-token head or no induction head.
    """
    cfg = model.cfg
    if cfg.n_layers != 2 or not cfg.attn_only:
        raise ValueError(f"the induction circuit is derived for a two-layer attention-only model, got n_layers={cfg.n_layers}, "
                         f"attn_only={cfg.attn_only}")
    prev = prev_token_scores(model, batch.tokens)[0]
    target = induction_scores(model, batch).target[1]
    P = [h for h in range(cfg.n_heads) if float(prev[h]) >= prev_token_head]
    I = [h for h in range(cfg.n_heads) if float(target[h]) >= induction_head]
    if not P:
        raise ValueError(f"no previous-token head in layer 0 (weights on i-1: {[round(float(x), 3) for x in prev]}, "
                         f"threshold {prev_token_head})")
    if not I:
        raise ValueError(f"no induction head in layer 1 (weights on i-p+1: {[round(float(x), 3) for x in target]}, "
                         f"threshold {induction_head})")
    comp = {k: composition_scores(model, k).scores[0, :, 1, :] for k in "qkv"}
    copying = copying_scores(model)[1]
    proposed: dict[tuple[str, str], str] = {}
    for p in P:
        lp = head_label(0, p)
        proposed[("embed", f"{lp}.v")] = f"previous-token head {lp} (weight on i-1 {float(prev[p]):.3f}) copies the previous token"
        for i in I:
            k, q, v = (float(comp[x][p, i]) for x in "kqv")
            if k > max(q, v):
                proposed[(lp, f"{head_label(1, i)}.k")] = f"K-composition {lp} -> {head_label(1, i)} {k:.3f} (Q {q:.3f}, V {v:.3f})"
    for i in I:
        li = head_label(1, i)
        proposed[("embed", f"{li}.q")] = f"induction head {li} (weight on i-p+1 {float(target[i]):.3f}) queries with the current token"
        proposed[("embed", f"{li}.v")] = f"{li} copies the token it attends to (copying score {float(copying[i]):.3f})"
        proposed[(li, "logits")] = f"{li} writes the prediction"

    layout = edge_layout(model)
    run = lambda c: evaluate_circuit(model, tokens, metric, c, reference=reference)  # noqa: E731
    full, empty = run(layout.edges()), run([])
    faith = lambda c: (run(c) - empty) / (full - empty)  # noqa: E731
    circuit, dropped = set(proposed), {}
    while True:
        base = faith(circuit)
        loo = {e: base - faith(circuit - {e}) for e in sorted(circuit)}
        weak = {e: d for e, d in loo.items() if d < necessary}
        if not weak:
            break
        dropped.update(weak)
        circuit -= set(weak)
    gains = {e: faith(circuit | {e}) - base for e in layout.edges() if e not in circuit}
    best_edge = max(gains.items(), key=lambda kv: kv[1], default=(None, 0.0))
    inside = {x.split(".")[0] for e in circuit for x in e}
    head_gains = {}
    for h in layout.senders:
        if h.startswith("L") and h not in inside:
            group = {e for e in layout.edges() if e[0] == h or e[1].split(".")[0] == h}
            head_gains[h] = faith(circuit | group) - base
    best_head = max(head_gains.items(), key=lambda kv: kv[1], default=(None, 0.0))
    evidence = {e: f"{proposed[e]}; leaving it out loses {loo[e]:.3f} of the faithfulness" for e in sorted(circuit)}
    return InductionGroundTruth(
        edges=frozenset(circuit), prev_token_heads=tuple(head_label(0, p) for p in P), induction_heads=tuple(head_label(1, i) for i in I),
        evidence=evidence, leave_one_out=loo, dropped=dropped, faithfulness=base, best_edge=best_edge, best_head=best_head,
        scores={"prev_token": prev.tolist(), "induction_target": target.tolist(), "copying": copying.tolist(),
                **{f"composition_{k}": v.tolist() for k, v in comp.items()}})


def induction_case(model: Model, batch: InductionBatch, *, n_pairs: int, reference: torch.Tensor, prev_token_head: float,
                   induction_head: float, necessary: float) -> tuple[GroundTruthCase, InductionGroundTruth]:
    """The trained induction model's case: the first ``n_pairs`` sequences of ``batch`` against
    ``reference`` (other repeated random sequences), the loss on the induction targets as the
    metric (the faithfulness section's), and the circuit :func:`induction_ground_truth` derives
    (the head scores over the whole ``batch``) on the model as trained; the case's model, which
    the methods are scored on, is its float64 copy. ``prev_token_head``, ``induction_head``,
    ``necessary``: the derivation's thresholds."""
    tokens, metric = batch.tokens[:n_pairs], next_token_loss(batch.targets[:n_pairs])
    truth = induction_ground_truth(model, batch, tokens=tokens, reference=reference, metric=metric, prev_token_head=prev_token_head,
                                   induction_head=induction_head, necessary=necessary)
    model = as_float64(model)
    response = receiver_response(model, tokens, reference, sorted(truth.edges))
    inert = {e: f"{e[1]}'s output does not move when it is patched" for e, moved in response.items() if moved <= 1e-9}
    case = GroundTruthCase("induction-2l", model, tokens, reference, metric, truth.edges, truth.edges - set(inert), inert,
                           "the loss on the induction targets")
    return case, truth
