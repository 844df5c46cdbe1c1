"""Position-aware edges (PEAP, Haklay et al. 2025): the edge graph with a position, or a span of positions, on every
edge.

**The positional graph.** A sender writes the residual stream at every position, and a receiver reads it at
every position; the edge ``(s, r)`` of :mod:`rs_interp.circuits.graph` is the sum of its *positional edges*
``(s, r, u)``: the sender's write at the positions of span ``u`` read by the receiver at those same
positions. Patching ``(s, r, u)`` adds the change of the sender's write ``w_s`` to receiver ``r``'s input at
span ``u``'s positions only. Attention moves information across positions inside a head: a head at a
query position reads its keys and values at that position and every earlier one, so the positional node
``(head, u)`` is fed by its query input at ``u`` and its key and value inputs at ``u`` and every earlier span
(PEAP's "crossing" edges are those connections, kept whole inside the head here: each head's key or value
input at a span feeds the head at that span and all later ones).

**Spans.** A :class:`PositionSchema` names the spans and says which span each position of each row is in
(``span_of``, (batch, pos)): every position in exactly one span, the spans in order along every row (a span
may be empty in a row). Prompts of different lengths are aligned by their spans (the subject, the verb, the
end ...: each task's builder in :mod:`rs_interp.tasks` gives its schema), or each position is its own span
(``"each"``, for prompts of one length).

**The identity.** Every first-order estimate is a sum over positions (``w_s . g_r`` summed over batch and
positions), so its positional edges sum to its edge: ``sum_u effect[s, r, u] = effect[s, r]`` (EAP, EAP-IG,
RelP; tested to 1e-12 in float64). An exact patch is not a sum: the patch of one span at a time
(:func:`rs_interp.path_patching` with ``spans=``) need not add up to the patch of every span at once.

>>> import torch
>>> schema = PositionSchema(("start", "end"), torch.tensor([[0, 0, 1], [0, 1, 1]]))
>>> schema.n_spans, schema.one_hot().sum(1).tolist()
(2, [[2.0, 1.0], [1.0, 2.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from jaxtyping import Bool, Float

from .._messages import few
from ..labels import count_of, parse

# the schema is the task's (its prompts' named spans): it lives with the tasks, which the methods read
from ..tasks.schema import PositionSchema
from .graph import EdgeLayout
from .selection import fixpoint

__all__ = ["PositionSchema", "PositionalEdgeEffects", "Positional", "resolve_spans", "positional_prune",
           "positional_mask", "positional_circuit_at", "positional_weights", "span_masks", "schema_of", "curve_rules"]


def resolve_spans(spans: object, tokens: torch.Tensor) -> PositionSchema | None:
    """``spans=`` as the helpers take it: None (no positions), ``"each"`` (every position its own
    span) or a :class:`PositionSchema` of ``tokens``."""
    if spans is None:
        return None
    if isinstance(spans, str) and spans == "each":
        return PositionSchema.each(tokens)
    if isinstance(spans, PositionSchema):
        return spans.check(tokens)
    raise ValueError(f"spans must be None, 'each' or a PositionSchema, got {spans!r}")


@dataclass(frozen=True)
class PositionalEdgeEffects:
    """A number per positional edge ``(sender, receiver, span)`` (module docstring).

    Attributes:
        layout: the edge graph the positions refine.
        spans: the span names (the schema's).
        effect: (sender, receiver, span), NaN where there is no edge.
        clean: the metric of the run.
        schema: the :class:`PositionSchema` of the run (which positions each span holds, per row).

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-1l")
        >>> a, b = ri.induction_batch(2, seed=0).tokens, ri.induction_batch(2, seed=1).tokens
        >>> eap = ri.edge_attribution_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, spans="each")
        >>> pos = eap.positional()
        >>> bool(torch.allclose(pos.total().effect.nan_to_num(0), eap.effect.nan_to_num(0), atol=1e-6))
        True
    """

    layout: EdgeLayout
    spans: tuple[str, ...]
    effect: Float[torch.Tensor, "sender receiver span"]
    clean: float
    schema: PositionSchema | None = None

    @property
    def exists(self) -> Bool[torch.Tensor, "sender receiver span"]:
        return self.layout.exists[..., None].expand(-1, -1, len(self.spans))

    @property
    def n_edges(self) -> int:
        return self.layout.n_edges * len(self.spans)

    def edges(self) -> list[tuple[str, str, str]]:
        """Every positional edge ``(sender, receiver, span)``, in the order of ``effect[exists]``."""
        return [(s, r, u) for (s, r) in self.layout.edges() for u in self.spans]

    def edge(self, sender: str, receiver: str, span: str) -> float:
        i, j = self.layout.index((sender, receiver))
        if span not in self.spans:
            raise ValueError(f"{span!r} is not a span ({self.spans})")
        return float(self.effect[i, j, self.spans.index(span)])

    def total(self):
        """The edge effects summed over the spans (:class:`rs_interp.circuits.EdgeEffects`): for a first-order estimate,
        the estimate without positions."""
        from .graph import EdgeEffects

        return EdgeEffects(self.layout, self.effect.nansum(-1).where(self.layout.exists, float("nan")), self.clean)

    def ranked(self, ranking: str = "absolute") -> list[int]:
        """Indices into :meth:`edges`, best first, by ``|effect|`` or ``effect`` (ties in that order, NaN left out)."""
        if ranking not in ("absolute", "signed"):
            raise ValueError(f"ranking must be 'absolute' or 'signed', got {ranking!r}")
        values = self.effect[self.exists].to(torch.float64)
        key = values.abs() if ranking == "absolute" else values
        order = key.nan_to_num(float("-inf")).argsort(descending=True, stable=True)
        return order[~values.isnan()[order]].tolist()

    def top(self, k: int = 5) -> list[tuple[tuple[str, str, str], float]]:
        """The ``k`` positional edges of largest ``|effect|``, ``((sender, receiver, span), effect)``."""
        from .._format import Top
        from ..exact.validate import check_int_range

        check_int_range("k", k, 1)
        edges, values = self.edges(), self.effect[self.exists]
        return Top((edges[i], float(values[i])) for i in self.ranked()[:k])


class Positional:
    """What a result computed with ``spans=`` gives (a mixin of the edge results): :meth:`positional`."""

    def positional(self) -> PositionalEdgeEffects:
        """The positional edges (:class:`PositionalEdgeEffects`) of a result computed with ``spans=``.

        Raises:
            ValueError: computed without ``spans=``.
        """
        per_span = getattr(self, "per_span", None)
        if per_span is None:
            raise ValueError("this result has no positions: compute it with spans='each' or a PositionSchema")
        schema = self.schema
        return PositionalEdgeEffects(self.layout, schema.names, per_span, self.clean, schema)


def positional_mask(layout: EdgeLayout, spans: Sequence[str], circuit: Iterable[tuple[str, str, str]]) -> torch.Tensor:
    """(sender, receiver, span) True at the circuit's positional edges ``(sender, receiver, span)``.

    Raises:
        ValueError: an entry that is not a ``(sender, receiver, span)`` of this graph and these spans.
    """
    out = torch.zeros(*layout.exists.shape, len(spans), dtype=torch.bool)
    for entry in circuit:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 3 and all(isinstance(x, str) for x in entry)):
            raise ValueError(f"a positional circuit's entries are (sender, receiver, span) triples, got {entry!r}")
        i, j = layout.index((entry[0], entry[1]))
        if entry[2] not in spans:
            raise ValueError(f"{entry[2]!r} is not one of the spans ({few(spans, 4)}; all: the schema's names)")
        out[i, j, list(spans).index(entry[2])] = True
    return out


def _input_columns(layout: EdgeLayout) -> tuple[list[str], dict[str, list[int]]]:
    """Per sender, the receiver columns whose inputs feed it: a head's query and its (KV) head's key and
    value; an MLP its input; none for the input senders."""
    kv = any(parse(r).kind == "kv_head" for r in layout.receivers)
    n_q = count_of(layout.receivers, "head", layer=0, input="q")
    n_kv = count_of(layout.receivers, "kv_head", layer=0, input="k")
    cols: dict[str, list[int]] = {}
    for s in layout.senders:
        c = parse(s)
        if c.kind == "head":
            own = {f"{s}.q", f"{s}.k", f"{s}.v"} if not kv else {f"{s}.q", f"L{c.layer}KV{c.index // (n_q // n_kv)}.k",
                                                                   f"L{c.layer}KV{c.index // (n_q // n_kv)}.v"}
            cols[s] = [j for j, r in enumerate(layout.receivers) if r in own]
        elif c.kind == "mlp":
            cols[s] = [layout.receivers.index(s)]
        else:
            cols[s] = []
    return list(layout.senders), cols


def positional_prune(layout: EdgeLayout, keep: torch.Tensor, *, passes: int | None = None) -> torch.Tensor:
    """``keep`` (sender, receiver, span) without dangling positional edges, MIB's pruning on the positional graph:
    repeatedly, the node (sender, span ``d``) is in iff it is fed (an input sender always; a head by a kept edge
    into its query at ``d`` or its key or value at ``d`` or an earlier span; an MLP into its input at ``d``) and
    has a kept outgoing edge at ``d``; a positional edge stays iff its sender's node is in and its receiver's
    input at that span reaches a node in (a query or MLP input: the node at the same span; a key or value
    input: the head at that span or a later one; ``logits``: always)."""
    keep = keep.clone() & layout.exists[..., None]
    S = keep.shape[-1]
    senders, cols = _input_columns(layout)
    earlier = torch.ones(S, S, dtype=torch.bool).tril()  # [d, u]: span u at or before d
    reader_of: dict[int, list[tuple[int, str]]] = {}  # receiver column -> the senders it feeds, with its input kind
    for i, s in enumerate(senders):
        for j in cols[s]:
            reader_of.setdefault(j, []).append((i, parse(layout.receivers[j]).input or "mlp"))
    def step(keep: torch.Tensor) -> torch.Tensor:
        fed_col = keep.any(0)  # (receiver, span): some kept edge into this input there
        alive = torch.zeros(len(senders), S, dtype=torch.bool)
        for i, s in enumerate(senders):
            if not cols[s]:
                incoming = torch.ones(S, dtype=torch.bool)
            else:
                incoming = torch.zeros(S, dtype=torch.bool)
                for j in cols[s]:
                    kind = parse(layout.receivers[j]).input or "mlp"
                    incoming |= (earlier & fed_col[j][None, :]).any(1) if kind in ("k", "v") else fed_col[j]
            alive[i] = incoming & keep[i].any(0)
        live = torch.zeros(len(layout.receivers), S, dtype=torch.bool)
        for j, r in enumerate(layout.receivers):
            if r == "logits":
                live[j] = True
            for i, kind in reader_of.get(j, []):
                live[j] |= (earlier.T & alive[i][None, :]).any(1) if kind in ("k", "v") else alive[i]
        return keep & alive[:, None, :] & live[None, :, :]

    return fixpoint(step, keep, passes)


def positional_weights(layout: EdgeLayout, n_spans: int) -> torch.Tensor:
    """(sender, receiver, span): how many edges of MIB's (ungrouped) graph each positional edge is."""
    from .selection import mib_weights

    return mib_weights(layout)[..., None].expand(-1, -1, n_spans)


def positional_circuit_at(scores: PositionalEdgeEffects, fraction: float, *, ranking: str = "absolute",
                          pruned: bool = True, higher_is_better: bool = False) -> torch.Tensor:
    """The positional circuit at ``fraction`` of the positional edges (:func:`rs_interp.circuits.selection.circuit_at`
    on the positional graph: the best positional edges while their MIB count stays within ``int(fraction * N)``,
    then :func:`positional_prune`). A (sender, receiver, span) mask."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
    if higher_is_better and ranking == "signed":
        scores = PositionalEdgeEffects(scores.layout, scores.spans, -scores.effect, -scores.clean, scores.schema)
    exists = scores.exists
    weights = positional_weights(scores.layout, len(scores.spans))[exists]
    budget = int(fraction * float(weights.sum()))
    order = torch.tensor(scores.ranked(ranking), dtype=torch.long)
    taken = order[: int((weights[order].cumsum(0) <= budget).sum())] if len(order) else order
    flat = torch.zeros(int(exists.sum()), dtype=torch.bool)
    flat[taken] = True
    keep = torch.zeros_like(exists)
    keep[exists] = flat
    return positional_prune(scores.layout, keep) if pruned else keep


def span_masks(schema: PositionSchema) -> torch.Tensor:
    """(span, batch, pos, 1): where each span's positional edges act."""
    return schema.one_hot().permute(2, 0, 1)[..., None]


def schema_of(scores: PositionalEdgeEffects, tokens: torch.Tensor) -> PositionSchema:
    """The positional scores' schema, checked to be one of ``tokens`` (a circuit's spans are positions of this run)."""
    if scores.schema is None:
        raise ValueError("positional scores without their schema cannot be evaluated: which positions each span holds "
                         "is unknown")
    return scores.schema.check(tokens)


def curve_rules(scores: PositionalEdgeEffects, layout: EdgeLayout, tokens: torch.Tensor) -> tuple:
    """What a faithfulness curve of positional scores uses: how it chooses a circuit (:func:`positional_circuit_at`),
    prunes it (:func:`positional_prune`), counts it (:func:`positional_weights`), and the spans' masks."""
    return (positional_circuit_at, positional_prune, positional_weights(layout, len(scores.spans)),
            span_masks(schema_of(scores, tokens)))
