"""``induction-2l``'s ground truth: the induction circuit derived from evidence on the model (the
theory proposes it, the attention and composition scores pick its heads and edges, circuit ablations
keep an edge only if leaving it out loses faithfulness).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .._backend import Model
from .._messages import few
from ..heads.composition import composition_scores
from ..heads.copying import copying_scores
from ..heads.roles import induction_scores, prev_token_scores
from ..labels import head_label
from ..metrics import Metric, next_token_loss
from ..models.data import InductionBatch
from .evaluation import evaluate_circuit
from .graph import EdgeLayout, edge_layout
from .ground_truth import GroundTruthCase, as_float64, receiver_response
from .positions import PositionSchema

__all__ = ["InductionGroundTruth", "induction_ground_truth", "induction_case", "period_spans"]


def period_spans(periods: torch.Tensor, width: int) -> PositionSchema:
    """The spans of repeated random sequences: each row's first period (its tokens seen once) and the repeats (where
    induction predicts), aligned across rows of different periods.

    >>> period_spans(torch.tensor([2, 3]), 5).span_of.tolist()
    [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
    """
    return PositionSchema(("first period", "repeats"), (torch.arange(width)[None] >= periods[:, None]).long())


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


def induction_ground_truth(model: Model, batch: InductionBatch, *, tokens: torch.Tensor, reference: torch.Tensor,
                           metric: Metric, prev_token_head: float, induction_head: float,
                           necessary: float) -> InductionGroundTruth:
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
        raise ValueError(f"the induction circuit is derived for a two-layer attention-only model, got "
                         f"n_layers={cfg.n_layers}, attn_only={cfg.attn_only}")
    prev = prev_token_scores(model, batch.tokens)[0]
    target = induction_scores(model, batch.tokens, periods=batch.periods).induction[1]
    P = [h for h in range(cfg.n_heads) if float(prev[h]) >= prev_token_head]
    I = [h for h in range(cfg.n_heads) if float(target[h]) >= induction_head]
    if not P:
        raise ValueError(f"no previous-token head in layer 0 (weights on i-1: "
                         f"{few((round(float(x), 3) for x in prev), 12)}, threshold {prev_token_head})")
    if not I:
        raise ValueError(f"no induction head in layer 1 (weights on i-p+1: "
                         f"{few((round(float(x), 3) for x in target), 12)}, threshold {induction_head})")
    comp = {k: composition_scores(model, k).scores[0, :, 1, :] for k in "qkv"}
    copying = copying_scores(model)[1]
    proposed = _proposal(prev, target, comp, copying, P, I)
    layout = edge_layout(model)
    faith = _faithfulness(model, tokens, reference, metric)
    circuit, dropped = set(proposed), {}
    while True:
        base = faith(circuit)
        loo = {e: base - faith(circuit - {e}) for e in sorted(circuit)}
        weak = {e: d for e, d in loo.items() if d < necessary}
        if not weak:
            break
        dropped.update(weak)
        circuit -= set(weak)
    best_edge, best_head = _best_additions(layout, circuit, base, faith)
    evidence = {e: f"{proposed[e]}; leaving it out loses {loo[e]:.3f} of the faithfulness" for e in sorted(circuit)}
    return InductionGroundTruth(
        edges=frozenset(circuit), prev_token_heads=tuple(head_label(0, p) for p in P),
        induction_heads=tuple(head_label(1, i) for i in I), evidence=evidence, leave_one_out=loo, dropped=dropped,
        faithfulness=base, best_edge=best_edge, best_head=best_head,
        scores={"prev_token": prev.tolist(), "induction_target": target.tolist(), "copying": copying.tolist(),
                **{f"composition_{k}": v.tolist() for k, v in comp.items()}})


def _proposal(prev: torch.Tensor, target: torch.Tensor, comp: dict[str, torch.Tensor], copying: torch.Tensor,
              P: list[int], I: list[int]) -> dict[tuple[str, str], str]:
    """The theory's edges (:func:`induction_ground_truth`), each with the evidence that proposes it."""
    proposed: dict[tuple[str, str], str] = {}
    for p in P:
        lp = head_label(0, p)
        proposed[("embed", f"{lp}.v")] = (f"previous-token head {lp} (weight on i-1 {float(prev[p]):.3f}) copies the "
                                          "previous token")
        for i in I:
            k, q, v = (float(comp[x][p, i]) for x in "kqv")
            if k > max(q, v):
                proposed[(lp, f"{head_label(1, i)}.k")] = (f"K-composition {lp} -> {head_label(1, i)} {k:.3f} "
                                                           f"(Q {q:.3f}, V {v:.3f})")
    for i in I:
        li = head_label(1, i)
        proposed[("embed", f"{li}.q")] = (f"induction head {li} (weight on i-p+1 {float(target[i]):.3f}) queries with "
                                          "the current token")
        proposed[("embed", f"{li}.v")] = f"{li} copies the token it attends to (copying score {float(copying[i]):.3f})"
        proposed[(li, "logits")] = f"{li} writes the prediction"
    return proposed


def _faithfulness(model: Model, tokens: torch.Tensor, reference: torch.Tensor,
                  metric: Metric) -> Callable[[set], float]:
    """A circuit's faithfulness, ``(m(circuit) - m(empty)) / (m(full) - m(empty))`` (resample ablation)."""
    def run(circuit) -> float:  # sub-circuits cut from the proposal may reach nothing: that is what is measured
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return evaluate_circuit(model, tokens, metric, circuit, reference=reference)
    full, empty = run(edge_layout(model).edges()), run([])
    return lambda c: (run(c) - empty) / (full - empty)


def _best_additions(layout: EdgeLayout, circuit: set, base: float,
                    faith: Callable[[set], float]) -> tuple[tuple, tuple]:
    """The edge outside the circuit whose addition gains the most faithfulness, and the head outside it (every
    edge into and out of it added), each with its gain."""
    gains = {e: faith(circuit | {e}) - base for e in layout.edges() if e not in circuit}
    best_edge = max(gains.items(), key=lambda kv: kv[1], default=(None, 0.0))
    inside = {x.split(".")[0] for e in circuit for x in e}
    head_gains = {}
    for h in layout.senders:
        if h.startswith("L") and h not in inside:
            group = {e for e in layout.edges() if e[0] == h or e[1].split(".")[0] == h}
            head_gains[h] = faith(circuit | group) - base
    best_head = max(head_gains.items(), key=lambda kv: kv[1], default=(None, 0.0))
    return best_edge, best_head


def induction_case(model: Model, batch: InductionBatch, *, n_pairs: int, reference: torch.Tensor,
                   prev_token_head: float, induction_head: float,
                   necessary: float) -> tuple[GroundTruthCase, InductionGroundTruth]:
    """The trained induction model's case: the first ``n_pairs`` sequences of ``batch`` against
    ``reference`` (other repeated random sequences), the loss on the induction targets as the
    metric (the faithfulness section's), and the circuit :func:`induction_ground_truth` derives
    (the head scores over the whole ``batch``) on the model as trained; the case's model, which
    the methods are scored on, is its float64 copy. ``prev_token_head``, ``induction_head``,
    ``necessary``: the derivation's thresholds."""
    tokens, metric = batch.tokens[:n_pairs], next_token_loss(batch.targets[:n_pairs])
    truth = induction_ground_truth(model, batch, tokens=tokens, reference=reference, metric=metric,
                                   prev_token_head=prev_token_head, induction_head=induction_head, necessary=necessary)
    model = as_float64(model)
    response = receiver_response(model, tokens, reference, sorted(truth.edges))
    inert = {e: f"{e[1]}'s output does not move when it is patched" for e, moved in response.items() if moved <= 1e-9}
    case = GroundTruthCase("induction-2l", model, tokens, reference, metric, truth.edges, truth.edges - set(inert),
                           inert, "the loss on the induction targets",
                           spans=period_spans(batch.periods[:n_pairs], tokens.shape[1]))
    return case, truth
