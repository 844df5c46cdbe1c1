"""The edge graph of a model: every component that writes the residual stream (a sender) and every
input that reads it (a receiver). One layout for every edge method, for circuits and for ground truth.

Senders, in depth order: ``embed`` (what enters ``blocks.0.hook_resid_pre``: the token embedding and,
for standard positions, the position embedding), every head ``L{l}H{h}`` and every MLP ``MLP{l}``.
The input node as EAP-IG (and so MIB) defines it is the token embedding alone, ``hook_embed``: with
``edge_layout(model, embedding="token")`` the first sender is ``tok_embed`` and the position
embedding is no sender (never ablated: what EAP-IG's ``evaluate_graph`` does); with
``embedding="split"`` both are senders, ``tok_embed`` and ``pos_embed`` (standard positions only);
``"sum"`` (the default) is their sum, ``embed``. Resampling gives the same numbers either way (the
positions of a pair are the same); zero and mean ablations do not.
Receivers: every head's query, key and value input ``L{l}H{h}.q`` / ``.k`` / ``.v`` (under
grouped-query attention the key and value inputs are per KV head, ``L{l}KV{g}.k`` / ``.v``), every
MLP's input ``MLP{l}`` and the final stream ``logits``.

The edge ``(sender, receiver)`` exists iff the sender is upstream: its depth is smaller. ``embed``
has depth 0, layer ``l``'s heads (and their inputs) ``2l + 1``, its MLP ``2l + 2`` (``2l + 1`` in a
parallel block, where the MLP reads the block's input as the heads do: no head -> MLP edge within
the layer), ``logits`` infinity.

>>> from rs_interp.models import make_attn_only
>>> layout = edge_layout(make_attn_only(2, n_heads=1))
>>> layout.senders, layout.receivers[:3]
(('embed', 'L0H0', 'L1H0'), ('L0H0.q', 'L0H0.k', 'L0H0.v'))
>>> layout.n_edges, bool(layout.exists[0, 0]), bool(layout.exists[2, 0])   # L1H0 -> L0H0.q: no
(12, True, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float

from .._backend import kv_groups

__all__ = ["EdgeLayout", "EdgeEffects", "edge_layout", "depth", "Embedding", "EMBEDDINGS", "embedding_of"]

Embedding = Literal["sum", "split", "token"]
#: The input senders of each choice of :func:`edge_layout`'s ``embedding``.
EMBEDDINGS: dict[str, tuple[str, ...]] = {"sum": ("embed",), "split": ("tok_embed", "pos_embed"),
                                          "token": ("tok_embed",)}

_HEAD = re.compile(r"^L(\d+)(?:H|KV)(\d+)(?:\.[qkv])?$")
_MLP = re.compile(r"^MLP(\d+)$")


def depth(label: str, *, parallel: bool = False) -> float:
    """Where a sender or receiver sits (module docstring): a sender precedes a receiver iff its depth
    is smaller.

    >>> depth("embed"), depth("L1H0"), depth("L1KV0.k"), depth("MLP1"), depth("MLP1", parallel=True), depth("logits")
    (0, 3, 3, 4, 3, inf)
    """
    if label in ("embed", "tok_embed", "pos_embed"):
        return 0
    if label == "logits":
        return float("inf")
    if m := _HEAD.match(label):
        return 2 * int(m.group(1)) + 1
    if m := _MLP.match(label):
        return 2 * int(m.group(1)) + (1 if parallel else 2)
    raise ValueError(f"not a sender or receiver label: {label!r}")


@dataclass(frozen=True)
class EdgeLayout:
    """The senders and receivers of a model, and which (sender, receiver) pairs are edges.

    Attributes:
        senders: labels in depth order (``embed``, per layer its heads then its MLP).
        receivers: labels in depth order (per layer each head's q, k, v inputs, then its MLP; ``logits``).
        exists: (sender, receiver) True where the sender is upstream of the receiver.

    Example:
        >>> from rs_interp import edge_layout, load_toy_model
        >>> layout = edge_layout(load_toy_model("induction-2l"))
        >>> layout.index(("L0H0", "L1H0.k")), bool(layout.exists[layout.index(("L0H0", "L1H0.k"))])
        ((1, 7), True)
    """

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    exists: Bool[torch.Tensor, "sender receiver"]

    @property
    def n_edges(self) -> int:
        return int(self.exists.sum())

    def edges(self) -> list[tuple[str, str]]:
        """Every edge ``(sender, receiver)``, row-major."""
        return [(s, r) for i, s in enumerate(self.senders) for j, r in enumerate(self.receivers) if self.exists[i, j]]

    def index(self, edge: tuple[str, str]) -> tuple[int, int]:
        """The (row, column) of ``edge`` in a (sender, receiver) matrix.

        Raises:
            ValueError: an unknown label, or a pair that is not an edge (the sender is not upstream).
        """
        sender, receiver = edge
        if sender not in self.senders or receiver not in self.receivers:
            unknown = sender if sender not in self.senders else receiver
            raise ValueError(f"{unknown!r} is not a {'sender' if unknown == sender else 'receiver'} of this model")
        i, j = self.senders.index(sender), self.receivers.index(receiver)
        if not self.exists[i, j]:
            raise ValueError(f"({sender!r}, {receiver!r}) is not an edge: {sender} is not upstream of {receiver}")
        return i, j


def edge_layout(model_or_cfg: Any, embedding: Embedding = "sum") -> EdgeLayout:
    """The :class:`EdgeLayout` of a model (or its config): MLP senders and receivers only for models
    with MLPs, key/value receivers per KV head under grouped-query attention, and no head -> MLP edge
    within a parallel block.

    ``embedding`` chooses the input senders (module docstring): ``"sum"`` (``embed``, the stream
    entering block 0), ``"token"`` (``tok_embed``, EAP-IG's input node: the position embedding is no
    sender) or ``"split"`` (``tok_embed`` and ``pos_embed``).

    Raises:
        ValueError: not a model or config; an unknown ``embedding``; ``"split"`` for a model without
            a position embedding added to the stream (rotary, shortformer, alibi positions).

    Example:
        >>> from rs_interp import load_toy_model
        >>> layout = edge_layout(load_toy_model("induction-2l"))
        >>> layout.senders, layout.n_edges, layout.edges()[0]
        (('embed', 'L0H0', 'L0H1', 'L1H0', 'L1H1'), 29, ('embed', 'L0H0.q'))
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if not all(hasattr(cfg, k) for k in ("n_layers", "n_heads", "attn_only")):
        raise ValueError(f"edge_layout takes a model or its config (with n_layers, n_heads, attn_only), got "
                         f"{type(model_or_cfg).__name__} {model_or_cfg!r:.60}")
    if embedding not in EMBEDDINGS:
        raise ValueError(f"embedding must be one of {tuple(EMBEDDINGS)}, got {embedding!r}")
    if embedding == "split" and getattr(cfg, "positional_embedding_type", "standard") != "standard":
        raise ValueError(f"embedding='split': this model's positions are {cfg.positional_embedding_type!r}, no "
                         "position embedding is added to the stream (hook_pos_embed), so the input has one part: use "
                         "'token' or 'sum'")
    L, H, G = cfg.n_layers, cfg.n_heads, kv_groups(cfg)
    mlps = not cfg.attn_only
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))
    senders, receivers = list(EMBEDDINGS[embedding]), []
    for l in range(L):
        senders += [f"L{l}H{h}" for h in range(H)] + ([f"MLP{l}"] if mlps else [])
        if G == H:
            receivers += [f"L{l}H{h}.{x}" for h in range(H) for x in "qkv"]
        else:  # grouped-query attention: one key and one value input per KV head
            receivers += [f"L{l}H{h}.q" for h in range(H)] + [f"L{l}KV{g}.{x}" for g in range(G) for x in "kv"]
        receivers += [f"MLP{l}"] if mlps else []
    receivers.append("logits")
    ds = torch.tensor([depth(s, parallel=parallel) for s in senders])
    dr = torch.tensor([depth(r, parallel=parallel) for r in receivers])
    return EdgeLayout(tuple(senders), tuple(receivers), ds[:, None] < dr[None, :])


def embedding_of(layout: EdgeLayout) -> Embedding:
    """Which ``embedding`` made ``layout`` (:func:`edge_layout`).

    >>> from rs_interp.models import make_attn_only
    >>> embedding_of(edge_layout(make_attn_only(1), embedding="token"))
    'token'
    """
    inputs = tuple(s for s in layout.senders if depth(s) == 0)
    return next(k for k, v in EMBEDDINGS.items() if v == inputs)


@dataclass(frozen=True)
class EdgeEffects:
    """A number per edge of a model's graph: estimated or measured changes of a metric.

    Attributes:
        layout: the senders, the receivers and which pairs are edges (:func:`edge_layout`).
        effect: (sender, receiver) the change of the metric when the edge is patched from the
            reference run; NaN where there is no edge (or, for a chosen subset, where not computed).
        clean: the metric of the run on ``tokens``.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)   # an EdgeEffects
        >>> isinstance(eap, EdgeEffects), eap.edge("L0H0", "L1H0.k") == float(eap.effect[1, 7])
        (True, True)
    """

    layout: EdgeLayout
    effect: Float[torch.Tensor, "sender receiver"]
    clean: float

    def edge(self, sender: str, receiver: str) -> float:
        """The number of one edge, e.g. ``result.edge("L0H1", "L1H0.k")``.

        Raises:
            ValueError: an unknown label, or a pair that is not an edge.
        """
        return float(self.effect[self.layout.index((sender, receiver))])

    def sender_totals(self) -> Float[torch.Tensor, " sender"]:
        """Per sender, the sum of its outgoing edges (NaN counted as 0)."""
        return self.effect.nan_to_num(0.0).sum(1)

    def ranked(self, ranking: str = "absolute") -> list[int]:
        """Indices into ``layout.edges()`` (row-major), best first: by ``|effect|`` (``"absolute"``) or
        by ``effect`` (``"signed"``, largest first), ties in the graph's order, NaN left out. Every
        choice of edges reads this ranking (``.top(k)``, :func:`rs_interp.top_edges`, the circuits of
        :func:`rs_interp.faithfulness_curve`)."""
        if ranking not in ("absolute", "signed"):
            raise ValueError(f"ranking must be 'absolute' or 'signed', got {ranking!r}")
        values = self.effect[self.layout.exists].to(torch.float64)
        key = values.abs() if ranking == "absolute" else values
        order = key.nan_to_num(float("-inf")).argsort(descending=True, stable=True)
        return order[~values.isnan()[order]].tolist()

    def on_inputs(self, embedding: Embedding) -> "EdgeEffects":
        """These effects on the graph with other input senders (:func:`edge_layout`'s ``embedding``),
        for effects against a reference run at the same positions (what every rs_interp method
        measures): the position embedding is then the same in both runs, so an edge from
        ``tok_embed`` has the effect of the same edge from ``embed``, and an edge from ``pos_embed`` 0.

        Raises:
            ValueError: effects not on the summed input (``embed``), or an unknown ``embedding``.

        Example:
            >>> from rs_interp.models import make_attn_only
            >>> layout = edge_layout(make_attn_only(1, n_heads=1, positional_embedding_type="standard"))
            >>> e = EdgeEffects(layout, torch.where(layout.exists, 1.0, torch.nan), 0.0).on_inputs("split")
            >>> e.layout.senders, e.edge("tok_embed", "logits"), e.edge("pos_embed", "logits")
            (('tok_embed', 'pos_embed', 'L0H0'), 1.0, 0.0)
        """
        if embedding not in EMBEDDINGS:
            raise ValueError(f"embedding must be one of {tuple(EMBEDDINGS)}, got {embedding!r}")
        if self.layout.senders[0] != "embed":
            raise ValueError("on_inputs maps effects on the summed input (embed), these are on "
                             f"{embedding_of(self.layout)!r}")
        inputs = EMBEDDINGS[embedding]
        senders = inputs + self.layout.senders[1:]
        blank = torch.where(self.layout.exists[:1], 0.0, torch.nan).to(self.effect.dtype)
        rows = [self.effect[:1]] + [blank] * (len(inputs) - 1)
        exists = torch.cat([self.layout.exists[:1]] * len(inputs) + [self.layout.exists[1:]])
        return EdgeEffects(EdgeLayout(tuple(senders), self.layout.receivers, exists),
                           torch.cat(rows + [self.effect[1:]]), self.clean)

    def top(self, k: int = 5) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` edges with the largest ``|effect|``, each ``((sender, receiver), effect)``, best
        first (NaN never picked)."""
        from .._format import Top
        from ..exact.validate import check_int_range

        check_int_range("k", k, 1)
        edges, values = self.layout.edges(), self.effect[self.layout.exists]
        return Top((edges[i], float(values[i])) for i in self.ranked()[:k])
