"""QK attributions: why a head attends where it does, in an attribution graph's local replacement model.

An attribution graph freezes every attention pattern, so it says what flows through a head but not
why the head looks there. Under the same freezes (every norm's scale at its clean value, each MLP's
output cut from its input except through its transcoder's skip), a head's query and key at layer
``l`` are *affine* in the graph's nodes: with ``write_s`` node ``s``'s write (an active feature's
``a W_dec[i]``, an error vector, a token embedding) and ``J`` the frozen map to ``ln1(resid_pre) W + b``,

    q = sum_s Q_s + Q_pos + Q_bias,     Q_s = R_q J_{q <- s} write_s / scale
    k = sum_t K_t + K_pos + K_bias,     K_t = R_k J_{k <- t} write_t

(``R_p`` the rotary rotation at position ``p``, the identity without rotary; ``scale`` the head's
score scale; ``Q_pos`` the part of the learned positional embeddings; ``Q_bias`` everything else
that no node writes: ``b_Q``, the norms' biases, the other blocks' biases, the transcoders' ``b_dec``).
The pre-softmax score is bilinear in them, so

    score = q . k = sum_{s, t} T[s, t],     T[s, t] = Q_s . K_t

over the sources ``s, t`` in: the graph's feature, error and token nodes, its unselected features
(one row), the positions and the bias. ``T[s, t]`` is exactly the change of the score when the
pair is removed, ``S(q, k) - S(q - Q_s, k) - S(q, k - K_t) + S(q - Q_s, k - K_t)``; under
grouped-query attention the key is the head's KV group's. Each ``Q_s`` comes from ``d_head``
backward passes batched in one (``is_grads_batched``), as the graph's rows do.

The **head loadings** of an attention edge ``(layer, head, query, key)``: its write into the stream at
``query``, ``o = pattern[query, key] v_key W_O[head]``, is also affine in the sources (the values are
read through the frozen ``ln1``), ``o = sum_s o_s``; node ``s``'s loading is ``o_s . o / |o|^2``, its
share of the write along it (the loadings sum to 1). On post-norm blocks the write is ``P_lin(o)``, ``o``
through the norm after the attention with its scale frozen (:mod:`rs_interp.exact.postnorm`), and the
loadings are ``P_lin(o_s) . P_lin(o) / |P_lin(o)|^2``.

:func:`top_attention` picks a graph's attention edges: those whose write moves the graph's logit
nodes (weighted by their probabilities, as the graph's influence is) most in the frozen model,
``pattern[q, k] (v_k . d target / d z_q)``: exactly the target's change when that write is removed.

What is checked on every call: the query and key parts sum to the run's rotated query and key, and
the table to the run's own score (read at ``hook_attn_scores`` or its emulation), or ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, apply_rotary, attn_scale, attn_weight, score_hooks
from .._format import Top
from .._keywords import renamed
from .._messages import few
from .._state import outside_inference_mode
from ..exact.certificate import confirm
from ..exact.needs import GRAPH, TRANSCODERS, needs
from ..exact.postnorm import attn_frozen, attn_post
from . import _conventions as C
from . import _replacement as R
from ._direct import Rows, active_nodes
from .graph import AttributionGraph
from .transcoders import TranscoderSet

__all__ = ["QKAttribution", "qk_attributions", "top_attention", "qk_json"]

#: The rows after the graph's nodes, in order.
EXTRA_SOURCES = ("unselected features", "position", "bias")


@dataclass(frozen=True)
class QKAttribution:
    """One attention score split over query-side x key-side sources (module docstring).

    Sources (rows and columns): the graph's nodes but its logits (node ``i`` of the graph is source
    ``i``), then :data:`EXTRA_SOURCES`: its unselected features, the positional embeddings, the bias.

    Attributes:
        layer, head, query, key: the attention edge (the query attends to the key).
        score: the run's pre-softmax score; pattern: its attention weight.
        query_parts: (source, d_head) each source's part of the rotated query, divided by the scale.
        key_parts: (source, d_head) each source's part of the rotated key.
        loadings: (source,) each source's share of the edge's write (sums to 1).
        labels: each source's label; tokens: the graph's prompt; n_graph_nodes: the graph's non-logit nodes.

    >>> import torch
    >>> a = QKAttribution(0, 0, 1, 0, 2.0, 0.5, torch.eye(5, 2), torch.eye(5, 2) * 2, torch.full((5,), 0.2),
    ...                   ("a", "b", "unselected features", "position", "bias"), torch.tensor([1, 2]), 2)
    >>> float(a.table.sum()), a.top(1)[0][0]
    (4.0, ('a', 'a'))
    """

    layer: int
    head: int
    query: int
    key: int
    score: float
    pattern: float
    query_parts: Float[torch.Tensor, "source d_head"]
    key_parts: Float[torch.Tensor, "source d_head"]
    loadings: Float[torch.Tensor, " source"]
    labels: tuple[str, ...]
    tokens: Int[torch.Tensor, " pos"]
    n_graph_nodes: int

    @property
    def table(self) -> Float[torch.Tensor, "source source"]:
        """``T[s, t] = Q_s . K_t``, [query-side source, key-side source]; it sums to :attr:`score`."""
        return self.query_parts @ self.key_parts.T

    def top(self, k: int = 10) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` entries of the table with the largest ``|T[s, t]|``, each ``((query source, key source), T)``."""
        flat = self.table.flatten()
        idx = flat.abs().topk(min(k, int((flat != 0).sum()))).indices
        n = len(self.labels)
        return Top(((self.labels[int(i) // n], self.labels[int(i) % n]), float(flat[i])) for i in idx)

    def top_entries(self, k: int = 10) -> list[tuple[int, int, float]]:
        """As :meth:`top`, by source index: ``(query source, key source, T)``."""
        flat = self.table.flatten()
        idx = flat.abs().topk(min(k, int((flat != 0).sum()))).indices
        n = len(self.labels)
        return [(int(i) // n, int(i) % n, float(flat[i])) for i in idx]


def _prepare(model: Model, transcoders: TranscoderSet, graph: AttributionGraph, what: str):
    R.check_replacement(model, transcoders, what)
    if not isinstance(graph, AttributionGraph):
        raise ValueError(f"{what}: graph must be an AttributionGraph, got {type(graph).__name__}")
    if graph.n_layers != model.cfg.n_layers or int(graph.tokens.max()) >= model.cfg.d_vocab:
        raise ValueError(f"{what}: the graph was not made with this model ({graph.n_layers} layers)")
    model = R.working_copy(model)
    return model, R.working_set(transcoders, model.cfg.dtype)


def _kv(model: Model, head: int) -> int:
    """The key/value head of query head ``head`` (grouped-query attention: its group's)."""
    n_kv = getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads
    return head // (model.cfg.n_heads // n_kv)


def _grab(model: Model, tokens: torch.Tensor, names: list[str], layers: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """The clean run's tensors at ``names`` (batch row 0) and, for ``layers``, the scores (``scores{l}``)."""
    box: dict[str, torch.Tensor] = {}
    hooks = [(n, lambda t, hook: box.__setitem__(hook.name, t.detach()[0].clone())) for n in names]
    for l in layers:
        hooks += score_hooks(model, l, box, f"scores{l}")
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(tokens[None], return_type="logits")
    return box | {f"scores{l}": box[f"scores{l}"][0] for l in layers}


def _constants(model: Model, tcs: TranscoderSet, clean: R.Clean, tokens: torch.Tensor, names: list[str],
               zero_positions: Sequence[int] = ()):
    """The tensors at ``names`` in the frozen model with every node off, with the positional embeddings
    (first) and without them (second): what no node writes (the graph's zeroed positions' MLP outputs included)."""
    out = []
    zero = torch.zeros_like(clean.embed)
    for drop_positions in (False, True):
        box: dict[str, torch.Tensor] = {}
        hooks = [(n, lambda t, hook: box.__setitem__(hook.name, t.detach()[0].clone())) for n in names]
        if drop_positions and N.POS_EMBED in model.hook_dict:
            hooks.append((N.POS_EMBED, lambda t, hook: torch.zeros_like(t)))
        with model.hooks(fwd_hooks=hooks):
            R.frozen_forward(model, tcs, clean, tokens[None], embed=zero,
                             outputs=C.frozen_outputs(tcs, clean, zero_positions))
        out.append(box)
    return out


def _rotation(model: Model, layer: int, pos: int, d_head: int, dtype: torch.dtype) -> torch.Tensor:
    """``M`` with ``rot_pos(x) = x @ M`` (the identity without rotary): the layer's rotary on a basis."""
    if model.cfg.positional_embedding_type != "rotary":
        return torch.eye(d_head, dtype=dtype)
    basis = torch.zeros(d_head, pos + 1, 1, d_head, dtype=model.cfg.dtype)
    basis[torch.arange(d_head), pos, 0, torch.arange(d_head)] = 1.0
    return apply_rotary(model, layer, basis)[:, pos, 0, :].to(dtype)


class _GraphColumns:
    """From the rows over every active feature (then errors, tokens) to the graph's sources: its
    selected features, errors, tokens, then the unselected features summed."""

    def __init__(self, graph: AttributionGraph, features: torch.Tensor, what: str) -> None:
        index = {tuple(f): i for i, f in enumerate(features.tolist())}
        missing = [tuple(f) for f in graph.features.tolist() if tuple(f) not in index]
        if missing or len(features) != graph.n_active:
            raise ValueError(f"{what}: the graph's features are not these transcoders' active features on its prompt "
                             f"({len(features)} active, the graph counted {graph.n_active}; "
                             f"e.g. {few(missing, 2)} inactive)")
        self.selected = torch.tensor([index[tuple(f)] for f in graph.features.tolist()], dtype=torch.long)
        self.n_active = len(features)
        self.unselected = torch.ones(self.n_active, dtype=torch.bool)
        self.unselected[self.selected] = False

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """(batch, active + (L+1) P) -> (batch, graph non-logit nodes + 1)."""
        n = self.n_active
        return torch.cat([rows[:, self.selected], rows[:, n:], rows[:, :n][:, self.unselected].sum(1, keepdim=True)], 1)


@needs(*GRAPH, "z", "heads", "values", "scores", "head inputs", "gradients", name="features.qk_attributions",
       optional=TRANSCODERS, refuses=("attention-only", "parallel blocks", "soft-capped logits"))
@renamed(top="k", edges="attention_edges")
@outside_inference_mode
def qk_attributions(model: Model, transcoders: TranscoderSet, graph: AttributionGraph,
                    attention_edges: Sequence[tuple[int, int, int, int]] | None = None, *,
                    k: int = 8) -> tuple[QKAttribution, ...]:
    """Each attention score of ``attention_edges`` split into a bilinear table of query-side x key-side sources,
    and the edge's head loadings, in the local replacement model of ``graph`` (module docstring).

    Args:
        transcoders: the set the graph was made with.
        graph: an :func:`~rs_interp.features.attribution_graph` of ``model``.
        attention_edges: ``(layer, head, query position, key position)`` each (an attention edge, not the
            edge graph's ``(sender, receiver)``); default the graph's ``k`` top attention edges
            (:func:`top_attention`).
        k: how many top attention edges, when ``attention_edges`` is not given.

    Raises:
        ValueError: what :func:`~rs_interp.features.attribution_graph` refuses, or a model whose attention
            score is not the bilinear form of its stream (the certificate's ``scores``: a soft-cap, ALiBi,
            a query/key norm); an edge out of range or with its key after its query; a graph made with
            other transcoders; parts that do not sum to the run's query, key or score.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, shipped_transcoders
    >>> model, tcs = load_toy_model("code-2l"), shipped_transcoders("code-2l")
    >>> g = attribution_graph(model, tcs, torch.arange(100, 108), targets=[108])
    >>> (a,) = qk_attributions(model, tcs, g, [(1, 0, 7, 3)])
    >>> abs(float(a.table.sum()) - a.score) < 1e-3, abs(float(a.loadings.sum()) - 1) < 1e-3
    (True, True)
    """
    model, tcs = _prepare(model, transcoders, graph, _QK)
    edges = attention_edges
    if edges is None:
        edges = [e for e, _ in _top_attention(model, tcs, graph, k)]
    edges = _check_edges(model, graph, edges)
    if not edges:
        return ()
    layers = sorted({e[0] for e in edges})
    names = [N.projection(l, w) for l in layers for w in "qkv"] + [N.z(l) for l in layers]
    with R.quiet_model(model):
        run = _QKRun(model, tcs, graph, names, layers)
        with torch.enable_grad():
            return tuple(run.edge(*e) for e in edges)


_QK = "features.qk_attributions"


def _check_edges(model: Model, graph: AttributionGraph, edges) -> list[tuple[int, ...]]:
    """``edges`` as tuples of ints, each (layer, head, query, key) in range with its key at or before its query."""
    P, L = graph.n_pos, graph.n_layers
    edges = [tuple(int(x) for x in e) for e in edges]
    for e in edges:
        if len(e) != 4 or not (0 <= e[0] < L and 0 <= e[1] < model.cfg.n_heads and 0 <= e[3] <= e[2] < P):
            raise ValueError(f"{_QK}: an edge is (layer, head, query, key) with key <= query < {P}, got {e}")
    return edges


class _QKRun:
    """One graph's replacement model run for the QK split: the clean run's values at the projections, their
    constant parts, and the gradient run whose backward passes give each source's part of a projection."""

    def __init__(self, model: Model, tcs: TranscoderSet, graph: AttributionGraph, names: list[str],
                 layers: list[int]) -> None:
        self.model, self.tcs, self.graph, tokens = model, tcs, graph, graph.tokens
        self.n_nodes = graph.n_nodes - graph.n_logits
        self.labels = graph.labels()[: self.n_nodes] + EXTRA_SOURCES
        clean = R.clean_run(model, tcs, tokens[None])
        self.seen = _grab(model, tokens, names + [N.pattern(l) for l in layers], layers)
        self.with_pos, self.without_pos = _constants(model, tcs, clean, tokens, names, graph.zero_positions)
        features, activations, errors = active_nodes(tcs, clean, graph.zero_positions)
        self.columns = _GraphColumns(graph, features, _QK)
        with torch.enable_grad():
            self.run = R.grad_forward(model, tcs, tokens[None], capture=tuple(names), patterns=clean.frozen)
            self.rows = Rows(self.run, features, activations, tcs, errors, clean.embed, graph.n_pos, graph.n_layers)

    def parts(self, name: str, pos: int, head: int, vector: torch.Tensor | None = None) -> torch.Tensor:
        """(source, d) each source's part of ``name``'s (pos, head) vector (``vector``: of its dot with it)."""
        t = self.run.captured[name]
        d = t.shape[-1]
        if vector is None:
            inject = torch.zeros(d, *t.shape, dtype=t.dtype)
            inject[torch.arange(d), 0, pos, head, torch.arange(d)] = 1.0
        else:
            inject = torch.zeros(1, *t.shape, dtype=t.dtype)
            inject[0, 0, pos, head] = vector.to(t.dtype)
        nodes = self.columns(self.rows.backward([t], [inject]))  # (d, graph sources + unselected)
        bias = self.without_pos[name][pos, head]
        const = torch.stack([self.with_pos[name][pos, head] - bias, bias]).to(nodes.dtype)
        if vector is not None:
            const = const @ vector.to(nodes.dtype)[:, None]
        return torch.cat([nodes.T, const])

    def edge(self, layer: int, head: int, q: int, k: int) -> QKAttribution:
        """One attention edge's bilinear table and head loadings, each checked against the run's own numbers."""
        model, seen, dt = self.model, self.seen, self.model.cfg.dtype
        kv = _kv(model, head)
        qn, kn, vn = (N.projection(layer, w) for w in "qkv")
        scale = attn_scale(model, layer)
        q_raw, k_raw = self.parts(qn, q, head), self.parts(kn, k, kv)
        confirm(_QK, "scores", q_raw.sum(0), seen[qn][q, head], q_raw, dt)
        confirm(_QK, "scores", k_raw.sum(0), seen[kn][k, kv], k_raw, dt)
        Q = q_raw @ _rotation(model, layer, q, q_raw.shape[1], q_raw.dtype) / scale
        K = k_raw @ _rotation(model, layer, k, k_raw.shape[1], k_raw.dtype)
        score = seen[f"scores{layer}"][head, q, k]
        confirm(_QK, "scores", (Q @ K.T).sum(), score, (Q @ K.T).flatten()[:, None], dt)
        pattern = seen[N.pattern(layer)][head, q, k]
        loadings = self.parts(vn, k, kv, self._along(layer, head, q, k, pattern))[:, 0]
        return QKAttribution(layer, head, q, k, float(score), float(pattern), Q.detach(), K.detach(),
                             loadings.detach(), self.labels, self.graph.tokens, self.n_nodes)

    def _along(self, layer: int, head: int, q: int, k: int, pattern: torch.Tensor) -> torch.Tensor:
        """The head loadings' read vector: each source's part of the edge's write o along o / |o|^2."""
        model, seen = self.model, self.seen
        W_O = attn_weight(model.blocks[layer].attn, "W_O", model.cfg.n_heads)[head].detach()
        o = pattern * seen[N.projection(layer, "v")][k, _kv(model, head)] @ W_O
        post = attn_post(model, layer, o.dtype)
        if post.kind is None:
            return pattern * (W_O @ (o / (o @ o).clamp(min=torch.finfo(o.dtype).tiny)))
        # a post-norm block: the write is o through the norm after the attention, its scale frozen
        s = attn_frozen(model, layer, seen[N.z(layer)][None], o.dtype)[1][0, q]
        w = post.linear(o, s)
        return pattern * (W_O @ post.readout(w / (w @ w).clamp(min=torch.finfo(w.dtype).tiny), s))


@needs(*GRAPH, "z", "heads", "values", name="features.top_attention", optional=TRANSCODERS,
       refuses=("attention-only", "parallel blocks", "soft-capped logits"))
@outside_inference_mode
def top_attention(model: Model, transcoders: TranscoderSet, graph: AttributionGraph,
                  k: int = 8) -> list[tuple[tuple[int, int, int, int], float]]:
    """The ``k`` attention edges ``(layer, head, query, key)`` whose write moves the graph's logit nodes
    most in its frozen replacement model, each with that effect (module docstring): the change of
    ``sum_i p_i logit_i`` (the logit nodes' values, weighted by their probabilities) if the edge's write
    ``pattern[q, k] v_k W_O`` were removed, negated.

    Raises:
        ValueError: as :func:`qk_attributions`.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, shipped_transcoders
    >>> model, tcs = load_toy_model("code-2l"), shipped_transcoders("code-2l")
    >>> g = attribution_graph(model, tcs, torch.arange(100, 108), targets=[108])
    >>> [len(e) for e, _ in top_attention(model, tcs, g, 3)]
    [4, 4, 4]
    """
    model, tcs = _prepare(model, transcoders, graph, "features.top_attention")
    return _top_attention(model, tcs, graph, k)


def _top_attention(model: Model, tcs: TranscoderSet, graph: AttributionGraph, k: int):
    L, H = graph.n_layers, model.cfg.n_heads
    zs = [N.z(l) for l in range(L)]
    W_U = model.W_U.detach()
    reads = W_U[:, graph.logit_tokens] - (W_U.mean(1, keepdim=True) if graph.centered else 0.0)
    target = reads @ graph.logit_probabilities.to(reads.dtype)  # (d_model,)
    with R.quiet_model(model):
        seen = _grab(model, graph.tokens, [N.projection(l, "v") for l in range(L)] + [N.pattern(l) for l in range(L)])
        with torch.enable_grad():
            run = R.grad_forward(model, tcs, graph.tokens[None], capture=tuple(zs))
            inject = torch.zeros_like(run.final)
            inject[0, graph.position] = target.to(inject.dtype)
            grads = torch.autograd.grad([run.final], [run.captured[n] for n in zs], [inject], allow_unused=True)
    effects = []
    kv = torch.tensor([_kv(model, h) for h in range(H)])
    for l in range(L):
        dz = grads[l][0] if grads[l] is not None else torch.zeros(graph.n_pos, H, model.cfg.d_head)
        v = seen[N.projection(l, "v")][:, kv]  # (key pos, head, d_head)
        effects.append(seen[N.pattern(l)] * torch.einsum("qhd,khd->hqk", dz.to(v.dtype), v))  # (head, q, k)
    E = torch.stack(effects)  # (layer, head, q, k)
    flat = E.flatten()
    idx = flat.abs().topk(min(k, int((flat != 0).sum()))).indices
    return Top((tuple(int(x) for x in torch.unravel_index(i, E.shape)), float(flat[i])) for i in idx)


def qk_json(graph: AttributionGraph, node_id, k: int = 10) -> list[dict]:
    """The graph's QK attributions as the JSON export's ``qk`` field (the frontend ignores it): per
    attention edge its score, pattern, the ``k`` largest table entries and head loadings, each source
    named by ``node_id(i)`` (the export's node id) where it gives one, else by its label.

    >>> qk_json(type("G", (), {"qk": ()})(), str)
    []
    """
    out = []
    for a in graph.qk:
        name = lambda i: (node_id(i) if i < a.n_graph_nodes else None) or a.labels[i]  # noqa: E731
        loads = a.loadings.abs().topk(min(k, len(a.loadings))).indices.tolist()
        entries = [{"query_source": name(s), "key_source": name(t), "value": v} for s, t, v in a.top_entries(k)]
        out.append({"layer": a.layer, "head": a.head, "query": a.query, "key": a.key, "score": a.score,
                    "pattern": a.pattern, "entries": entries,
                    "loadings": [{"source": name(i), "value": float(a.loadings[i])} for i in loads]})
    return out
