"""Choosing a circuit from edge scores: the ranking, the sizes MIB counts, and pruning dangling edges.

One ranking serves every choice: the edges by ``|effect|`` (``"absolute"``) or by ``effect``
(``"signed"``, largest first), ties broken by the edges' order in the graph (row-major), NaN never
chosen. ``scores.top(k)`` and :func:`top_edges` both read it.

MIB's circuit track (Mueller et al. 2025; ``hannamw/MIB-circuit-track`` and its EAP-IG ``Graph``)
counts a circuit's size in edges of a graph whose key and value inputs are per *query* head (it
ungroups grouped-query attention), keeps ``int(f * N)`` edges at fraction ``f`` of the ``N`` edges,
and prunes the result: a component with no incoming edge (the embedding excepted) or no outgoing edge
(the logits excepted) is dropped with its edges, until nothing changes. :func:`circuit_at` does the
same on rs_interp's graph, where an edge into a key/value head's input counts as the edges into the
inputs of the query heads that read it.

>>> from rs_interp import edge_layout
>>> from rs_interp.models import make_attn_only
>>> layout = edge_layout(make_attn_only(2, n_heads=1))
>>> keep = prune(layout, mask(layout, [("embed", "L0H0.v"), ("L0H0", "L1H0.v")]))   # L1H0 writes nowhere kept
>>> int(keep.sum())
0
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal

import torch

from .._keywords import renamed
from .._messages import few
from ..labels import count_of, node_label, parse
from .graph import EdgeEffects, EdgeLayout

__all__ = ["Ranking", "RANKINGS", "RECOVERED_SHARE", "rank", "top_edges", "mask", "prune", "mib_weights", "circuit_at",
           "smallest_recovering"]

Ranking = Literal["absolute", "signed"]
RANKINGS = ("absolute", "signed")
#: The share of the metric a default circuit recovers: :func:`circuit_at` without a fraction (and ``rs-interp
#: circuit`` without ``--size``) takes the smallest circuit on the faithfulness curve whose faithfulness reaches it.
RECOVERED_SHARE = 0.8


def rank(scores: EdgeEffects, ranking: Ranking = "absolute") -> list[int]:
    """Indices into ``scores.layout.edges()`` (row-major), best first, NaN left out (module docstring)."""
    if not isinstance(scores, EdgeEffects):
        raise ValueError(f"scores must be edge scores (an EdgeEffects), got {type(scores).__name__}")
    return scores.ranked(ranking)


@renamed(n="k")
def top_edges(scores: EdgeEffects, k: int, *, ranking: Ranking = "absolute",
              pruned: bool = False) -> list[tuple[str, str]]:
    """The ``k`` best edges of ``scores``, best first: the ranking of ``scores.top(k)``.

    The top ``k`` need not connect the embedding to the logits (then ablating everything else leaves
    the metric at its fully ablated value, and :func:`~rs_interp.evaluate_circuit` warns). With
    ``pruned=True`` the answer drops the dangling ones, as MIB's ``Graph.prune`` does: an edge stays iff
    its sender is reached from ``embed`` and its receiver reaches ``logits`` through kept edges; the
    survivors keep their rank order, so the list may be shorter than ``k``.

    Raises:
        ValueError: ``k`` not an int in ``[0, number of scored edges]``, or an unknown ranking.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> eap = rs_interp.edge_attribution_patching(model, a, lambda logits: logits[:, -1, 0].mean(), reference=b)
        >>> top_edges(eap, 3) == [edge for edge, _ in eap.top(3)]
        True
        >>> set(top_edges(eap, 3, pruned=True)) <= set(top_edges(eap, 3))
        True
    """
    from ..exact.validate import check_int_range

    if not isinstance(pruned, bool):
        raise ValueError(f"pruned must be True or False, got {pruned!r}")
    order = rank(scores, ranking)
    k = check_int_range("k", k, 0, len(order))
    edges = scores.layout.edges()
    if not pruned:
        return [edges[i] for i in order[:k]]
    layout = scores.layout
    rows, cols = layout.exists.nonzero(as_tuple=True)  # edges() lists the existing edges in this order
    keep = torch.zeros_like(layout.exists)
    keep[rows[order[:k]], cols[order[:k]]] = True
    kept = prune(layout, keep)
    return [edges[i] for i in order[:k] if bool(kept[rows[i], cols[i]])]


def mask(layout: EdgeLayout, circuit: Iterable[tuple[str, str]]) -> torch.Tensor:
    """(sender, receiver) True at the circuit's edges.

    Raises:
        ValueError: an entry that is not a ``(sender, receiver)`` pair of this graph's labels (named).
    """
    if isinstance(circuit, (str, bytes, EdgeEffects)) or not isinstance(circuit, Iterable):
        raise ValueError(f"a circuit is an iterable of (sender, receiver) edges, got {type(circuit).__name__}")
    out = torch.zeros_like(layout.exists)
    for entry in circuit:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise ValueError(f"circuit entries must be (sender, receiver) label pairs, got {entry!r}")
        out[layout.index(tuple(entry))] = True
    return out


def _component(label: str) -> str:
    """The component a receiver feeds: the head for a query input, the KV head for a key or value
    input, the MLP for its input, ``logits``."""
    return node_label(label)


def prune(layout: EdgeLayout, keep: torch.Tensor, *, passes: int | None = None) -> torch.Tensor:
    """``keep`` without dangling edges (MIB's ``Graph.prune``): repeatedly, a component is in the circuit
    iff it has a kept incoming edge (``embed`` always has) and a kept outgoing edge (``logits`` always
    has), and an edge is kept iff its sender and its receiver's component are in. A query head's
    incoming edges are its own and those into the key/value heads it reads.

    ``passes=1``: one such pass, what the ``Graph.prune`` of the EAP-IG commit MIB pins (7af394a) leaves
    after ``apply_topn`` (its loop stops when the components computed from the edges are those
    ``apply_topn`` set, before the edges this pass removed are looked at again): the circuit MIB
    counts (:attr:`rs_interp.circuits.FaithfulnessCurve.mib_counts`). Its ``evaluate_graph`` prunes again, to
    the end, so the circuit it evaluates is ``passes=None``'s."""
    keep = keep.clone() & layout.exists
    comp = [_component(r) for r in layout.receivers]
    n_kv = count_of(layout.receivers, "kv_head", layer=0, input="k")
    heads_per_layer = count_of(layout.receivers, "head", layer=0, input="q")
    group = heads_per_layer // n_kv if n_kv else 1

    def reads(sender: str) -> list[str]:
        """The components whose inputs feed ``sender`` (a head reads its query and its KV head)."""
        c = parse(sender)
        if c.kind == "head":
            out = [sender]
            if n_kv:
                out.append(f"L{c.layer}KV{c.index // group}")
            return out
        return [sender]

    def step(keep: torch.Tensor) -> torch.Tensor:
        fed = {comp[j] for j in range(len(comp)) if bool(keep[:, j].any())}
        alive = []
        for i, s in enumerate(layout.senders):
            incoming = s in ("embed", "tok_embed", "pos_embed") or any(r in fed for r in reads(s))
            alive.append(incoming and bool(keep[i].any()))
        # a KV head is in iff a query head reading it is
        live = {s for s, a in zip(layout.senders, alive) if a}
        live_kv = {f"L{parse(s).layer}KV{parse(s).index // group}" for s in live if parse(s).kind == "head" and n_kv}
        col_ok = torch.tensor([c == "logits" or c in live or c in live_kv for c in comp])
        return keep & torch.tensor(alive)[:, None] & col_ok[None, :]

    return fixpoint(step, keep, passes)


def fixpoint(step: Callable[[torch.Tensor], torch.Tensor], keep: torch.Tensor, passes: int | None) -> torch.Tensor:
    """``step`` applied to ``keep`` until nothing changes, or ``passes`` times (a pruning's passes)."""
    while True:
        new = step(keep)
        if torch.equal(new, keep):
            return keep
        keep = new
        if passes is not None:
            passes -= 1
            if passes <= 0:
                return keep


def check_fractions(fractions: object) -> list[float]:
    """A faithfulness curve's ``fractions``, checked: increasing numbers within (0, 1]."""
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Iterable):
        raise ValueError(f"fractions must be a sequence of numbers in (0, 1], got {fractions!r}")
    fr = list(fractions)
    if not fr or any(isinstance(f, bool) or not isinstance(f, (int, float)) for f in fr):
        raise ValueError(f"fractions must be a non-empty sequence of numbers in (0, 1], got {fractions!r}")
    fr = [float(f) for f in fr]
    if any(not 0 < f <= 1 for f in fr) or any(b <= a for a, b in zip(fr, fr[1:])):
        raise ValueError(f"fractions must increase within (0, 1], got {few(fractions, 10)}")
    return fr


def mib_weights(layout: EdgeLayout) -> torch.Tensor:
    """(sender, receiver) how many edges of MIB's graph each edge is: 1, or the number of query heads
    reading a key/value head under grouped-query attention (MIB ungroups it); 0 where no edge."""
    n_q = count_of(layout.receivers, "head", layer=0, input="q")
    n_kv = count_of(layout.receivers, "kv_head", layer=0, input="k")
    w = torch.tensor([n_q // n_kv if n_kv and parse(r).kind == "kv_head" else 1 for r in layout.receivers],
                     dtype=torch.float64)
    return layout.exists.to(torch.float64) * w[None, :]


def circuit_at(scores: EdgeEffects, fraction: float | None = None, *, ranking: Ranking | None = None,
               pruned: bool = True, higher_is_better: bool | None = None, curve: Any = None,
               share: float = RECOVERED_SHARE) -> torch.Tensor:
    """The circuit MIB evaluates at ``fraction`` of the edges: the best edges of ``scores`` (in rank
    order, while their MIB count stays within ``int(fraction * N)``, ``N`` the graph's MIB count),
    dangling edges pruned (``pruned=True``, as MIB does). A (sender, receiver) mask.

    Without a ``fraction``, the default circuit of a faithfulness ``curve`` of these scores: the smallest
    circuit on it whose faithfulness reaches ``share`` of the metric (:data:`RECOVERED_SHARE`, 80%), at the
    curve's fraction, in its ranking and its metric's direction (:func:`smallest_recovering`; ``curve`` a
    :class:`~rs_interp.circuits.FaithfulnessCurve`, typed ``Any`` here: evaluation reads this module).

    MIB ranks the scores of the *loss* (:func:`rs_interp.circuits.mib_importances`): by signed score,
    the edges whose patching raises the loss most come first. ``higher_is_better=True`` (a logit or
    probability difference) ranks ``-effect`` so, the smallest effect first; ``False`` (the
    default, ``None``, with no curve: the metric is a loss) ranks ``effect``, the largest first. ``|effect|``
    ranks the same either way. With a ``curve``, ``None`` is the curve's own direction.

    ``ranking``: ``"absolute"`` by default (the curve's own without a fraction).

    Raises:
        ValueError: ``fraction`` not a number in [0, 1]; ``higher_is_better`` not a bool or None, or not the
            direction of the ``curve`` taken from; neither a ``fraction`` nor a ``curve``, or no circuit on the
            curve recovering ``share``.

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(8, seed=0).tokens, ri.induction_batch(8, seed=1).tokens
        >>> loss = ri.next_token_loss(ri.next_token_targets(a))
        >>> eap = ri.edge_attribution_patching(model, a, loss, reference=b)
        >>> curve = ri.faithfulness_curve(model, a, loss, eap, reference=b)
        >>> k = smallest_recovering(curve)
        >>> torch.equal(circuit_at(eap, curve=curve), circuit_at(eap, curve.fractions[k])), curve.faithfulness[k] >= 0.8
        (True, True)
    """
    if fraction is None:
        if curve is None:
            raise ValueError("circuit_at needs a fraction of the edges, or curve= (a faithfulness curve of these "
                             f"scores) to take the smallest circuit on it that recovers {share:.0%} of the metric.")
        k = smallest_recovering(curve, share)
        fraction, ranking, higher_is_better = curve.fractions[k], curve.ranking, _curve_direction(
            curve, higher_is_better)
    ranking = "absolute" if ranking is None else ranking
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
    if higher_is_better is None:
        higher_is_better = False  # the metric is a loss, as MIB ranks it
    if not isinstance(higher_is_better, bool):
        raise ValueError(f"higher_is_better must be True, False or None, got {higher_is_better!r}")
    if higher_is_better and ranking == "signed":
        scores = EdgeEffects(scores.layout, -scores.effect, -scores.clean)
    layout = scores.layout
    weights = mib_weights(layout)[layout.exists]
    budget = int(fraction * float(weights.sum()))
    keep = torch.zeros_like(layout.exists)
    rows, cols = layout.exists.nonzero(as_tuple=True)
    order = torch.tensor(rank(scores, ranking), dtype=torch.long)
    # the best edges while their count stays within the budget: a prefix of the ranking (every weight
    # is a positive integer, their running sums exact in float64)
    taken = order[: int((weights[order].cumsum(0) <= budget).sum())]
    keep[rows[taken], cols[taken]] = True
    return prune(layout, keep) if pruned else keep


def _curve_direction(curve: Any, higher_is_better: bool | None) -> bool | None:
    """The metric's direction of the circuits on ``curve``: its own, which an explicit ``higher_is_better`` must
    agree with (the signed ranking's circuits differ by direction; the absolute ranking's do not)."""
    own = getattr(curve, "higher_is_better", None)
    if own is None or higher_is_better is None or curve.ranking != "signed":
        return own if higher_is_better is None else higher_is_better
    if higher_is_better != own:
        raise ValueError(f"higher_is_better={higher_is_better} disagrees with the curve's signed ranking, which took "
                         f"higher_is_better={own} (from {getattr(curve, 'direction_from', None) or 'its metric'}); "
                         "leave it out to take the curve's circuits.")
    return own


def smallest_recovering(curve: Any, share: float = RECOVERED_SHARE) -> int:
    """The index into ``curve`` (a :class:`~rs_interp.circuits.FaithfulnessCurve`) of its smallest circuit (fewest edges
    kept, then the smaller fraction) whose faithfulness reaches ``share`` (faithfulness 1: the metric of the full model;
    0: of the empty circuit).

    Raises:
        ValueError: ``share`` not a number in (0, 1]; no circuit on the curve reaching it (the message gives
            the best there is).
    """
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"share must be a number in (0, 1], the part of the metric a circuit recovers, got {share!r}.")
    reach = [k for k, f in enumerate(curve.faithfulness) if f == f and f >= share]
    if not reach:
        best = max((f for f in curve.faithfulness if f == f), default=float("nan"))
        raise ValueError(f"No circuit on this faithfulness curve recovers {share:.0%} of the metric (the best: "
                         f"{best:.3f}). Add the fraction 1.0 to its fractions, or ask for a lower share.")
    return min(reach, key=lambda k: (curve.n_edges[k], curve.fractions[k]))
