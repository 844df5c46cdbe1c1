"""An attribution graph's record, its influence, its pruning and its two scores.

Nodes, in circuit-tracer's order: the selected feature nodes, the error nodes (layer-major: layer
``l``, position ``p`` at ``n_features + l * n_pos + p``), the token nodes (one per position), the
logit nodes. ``adjacency[t, s]`` is the direct effect of source ``s`` on target ``t`` (rows of
error and token nodes are 0: nothing writes into them).

Influence (Ameisen et al. 2025): with ``Â`` the adjacency with each row's absolute values scaled to
sum 1, and ``w`` the logit nodes' probabilities, a node's influence is ``(w (Â + Â² + ...))``, the
total weight of every path from it to the logits (the graph is acyclic, so the series ends).
Pruning keeps the nodes that carry ``node_threshold`` of the cumulative influence (tokens and logits
always) and then the edges that carry ``edge_threshold`` of the edge influence, dropping features left
without an edge in or out and error nodes left without one out.

Scores (circuit-tracer's ``compute_graph_scores``): the **replacement score** is the part of the
tokens' and errors' influence that starts at tokens, ``I_tok / (I_tok + I_err)``; the
**completeness score** the influence-weighted part of each node's normalised input that does not
come from error nodes. Both are 1 when no error node carries anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int

from .._format import Top
from . import _rows
from ._rows import RowMatrix

__all__ = ["AttributionGraph", "PrunedGraph", "GraphScores"]


@dataclass(frozen=True)
class GraphScores:
    """How much of a graph flows through features rather than error nodes (both in [0, 1]).

    Attributes:
        replacement: the tokens' share of the influence of tokens and error nodes.
        completeness: the influence-weighted share of node inputs that is not error.

    >>> GraphScores(1.0, 1.0).replacement
    1.0
    """

    replacement: float
    completeness: float


@dataclass(frozen=True)
class AttributionGraph:
    """The direct effects between features, error nodes, tokens and logits in the local replacement
    model of one prompt (:func:`rs_interp.features.attribution_graph`).

    Attributes:
        tokens: (pos,) the prompt.
        features: (feature, 3) each feature node's (layer, position, index in its transcoder).
        activations: (feature,) its activation.
        logit_tokens: (logit,) the token of each logit node; logit_probabilities: (logit,) its probability.
        adjacency: (node, node) direct effects, [target, source] (module docstring for the order): a
            tensor, or (``attribution_graph(..., dense=False)``) a :class:`~rs_interp.features._rows.RowMatrix`
            holding only the rows that can be nonzero, read the same way (``adjacency[t, s]``, ``adjacency[rows]``,
            ``adjacency.dense()``).
        values: (node,) each target's value in the run: a feature's pre-activation, a logit's
            demeaned value (``logit - mean(logits)``); 0 for error and token nodes.
        bias: (node,) each target's constant part: its value with every node switched off (the
            positional embedding, every bias, the transcoders' ``b_dec``).
        unselected: (node,) the part of each target's value from active features that are not
            nodes (with ``max_feature_nodes``; 0 otherwise).
        n_layers: layers of the model; position: where the logits are read; n_active: active
            features in the prompt; scan: the transcoders' identifier; centered: whether logit
            values are centered (logit minus the mean logit) or raw.
        errors: (layer, pos, d_model) each error node's vector (MLP output minus reconstruction).
        qk: the QK attributions attached with :meth:`with_qk` (:class:`rs_interp.features.qk.QKAttribution`), if any.
        zero_positions: the positions whose features and error vectors are no nodes (circuit-tracer's
            ``zero_positions``): no feature node there, the error vectors there 0, what their MLP outputs
            hold part of ``bias``.

    ``adjacency.sum(1) + unselected + bias == values`` on every feature and logit row (checked when
    the graph is built).

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> g = attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2]))
    >>> rows = torch.cat([torch.arange(g.n_features), torch.arange(g.n_nodes - g.n_logits, g.n_nodes)])
    >>> bool(torch.allclose(g.adjacency[rows].sum(1) + g.bias[rows], g.values[rows], atol=1e-5)), g.kinds()[-1]
    (True, 'logit')
    """

    tokens: Int[torch.Tensor, " pos"]
    features: Int[torch.Tensor, "feature 3"]
    activations: Float[torch.Tensor, " feature"]
    logit_tokens: Int[torch.Tensor, " logit"]
    logit_probabilities: Float[torch.Tensor, " logit"]
    adjacency: Float[torch.Tensor, "node node"] | RowMatrix
    values: Float[torch.Tensor, " node"]
    bias: Float[torch.Tensor, " node"]
    unselected: Float[torch.Tensor, " node"]
    errors: Float[torch.Tensor, "layer pos d_model"]
    n_layers: int
    position: int
    n_active: int
    scan: str = "rs_interp"
    centered: bool = True
    qk: tuple = ()
    zero_positions: tuple[int, ...] = ()

    def with_qk(self, qk) -> "AttributionGraph":
        """This graph with the QK attributions ``qk`` (from :func:`rs_interp.features.qk_attributions` on
        it) attached: the JSON export writes them in a ``qk`` field and the figure draws their edges.

        Raises:
            ValueError: an attribution made on another graph (other tokens or node count).
        """
        qk = tuple(qk)
        for a in qk:
            if a.n_graph_nodes != self.n_nodes - self.n_logits or not torch.equal(a.tokens, self.tokens):
                raise ValueError(f"with_qk: the attribution of L{a.layer}H{a.head} was made on another graph")
        return dataclasses.replace(self, qk=qk)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_logits(self) -> int:
        return len(self.logit_tokens)

    @property
    def n_nodes(self) -> int:
        return self.adjacency.shape[0]

    def feature_node(self, layer: int, pos: int, index: int) -> int:
        """The node index of feature ``index`` of layer ``layer`` at position ``pos``.

        Raises:
            ValueError: that feature is not a node (inactive there, or not selected).
        """
        hit = ((self.features == torch.tensor([layer, pos, index])).all(1)).nonzero()
        if len(hit) == 0:
            raise ValueError(f"feature {index} of layer {layer} at position {pos} is not a node of this graph")
        return int(hit[0, 0])

    def error_node(self, layer: int, pos: int) -> int:
        return self.n_features + layer * self.n_pos + pos

    def token_node(self, pos: int) -> int:
        return self.n_features + self.n_layers * self.n_pos + pos

    def logit_node(self, i: int) -> int:
        return self.n_nodes - self.n_logits + i

    def kinds(self) -> tuple[str, ...]:
        """Each node's kind: ``"feature"``, ``"error"``, ``"token"`` or ``"logit"``."""
        return (("feature",) * self.n_features + ("error",) * (self.n_layers * self.n_pos) + ("token",) * self.n_pos
                + ("logit",) * self.n_logits)

    def labels(self, decode=None) -> tuple[str, ...]:
        """Each node's label: ``"L1 F233 @5"``, ``"err L0 @5"``, ``"tok 17 @5"``, ``"logit 42"``; with
        ``decode`` (token id -> text), tokens and logits show their text."""
        show = (lambda t: repr(decode(int(t)))) if decode is not None else (lambda t: str(int(t)))
        out = [f"L{l} F{i} @{p}" for l, p, i in self.features.tolist()]
        out += [f"err L{l} @{p}" for l in range(self.n_layers) for p in range(self.n_pos)]
        out += [f"tok {show(t)} @{p}" for p, t in enumerate(self.tokens)]
        out += [f"logit {show(t)}" for t in self.logit_tokens]
        return tuple(out)

    def logit_weights(self) -> torch.Tensor:
        w = torch.zeros(self.n_nodes, dtype=self.adjacency.dtype)
        w[self.n_nodes - self.n_logits:] = self.logit_probabilities.to(w.dtype)
        return w

    def target_nodes(self) -> torch.Tensor:
        """The nodes that have inputs (features, then logits): the rows of the adjacency that can be nonzero."""
        return torch.cat([torch.arange(self.n_features), torch.arange(self.n_nodes - self.n_logits, self.n_nodes)])

    def row_gaps(self) -> torch.Tensor:
        """(target,) ``|A.sum(1) + unselected + bias - values|`` on :meth:`target_nodes`: the graph's identity (class
        docstring), zero up to rounding; the one row-sum check (``attribution_graph``'s, the reproduction's)."""
        rows = self.target_nodes()
        return (self.rows().sum(1) + self.unselected[rows] + self.bias[rows] - self.values[rows]).abs()

    def rows(self) -> torch.Tensor:
        """(target, source) the adjacency's rows :meth:`target_nodes` over its non-logit columns."""
        return _rows.block(self.adjacency, self.target_nodes(), self.n_nodes - self.n_logits)

    def dense_adjacency(self) -> torch.Tensor:
        """The (node, node) adjacency as a tensor, however stored."""
        return self.adjacency.dense() if isinstance(self.adjacency, RowMatrix) else self.adjacency

    def influence(self) -> Float[torch.Tensor, " node"]:
        """Each node's influence on the logits (module docstring)."""
        return _rows.influence(_rows.normalized(self.rows()), self.target_nodes(), self.logit_weights())

    def scores(self) -> GraphScores:
        """The replacement and completeness scores (module docstring).

        >>> from rs_interp.features import attribution_graph, mlp_transcoders
        >>> from rs_interp import load_toy_model
        >>> import torch
        >>> model = load_toy_model("tracr-sort")
        >>> g = attribution_graph(model, mlp_transcoders(model), torch.tensor([0, 3, 1, 2]), position=-1)
        >>> s = g.scores(); round(s.replacement, 6), round(s.completeness, 6)
        (1.0, 1.0)
        """
        A, targets = _rows.normalized(self.rows()), self.target_nodes()
        w = self.logit_weights()
        infl = _rows.influence(A, targets, w)
        err = slice(self.n_features, self.n_features + self.n_layers * self.n_pos)
        tok = slice(err.stop, err.stop + self.n_pos)
        i_tok, i_err = infl[tok].sum(), infl[err].sum()
        replacement = float(i_tok / (i_tok + i_err)) if float(i_tok + i_err) > 0 else 1.0
        weight = infl + w
        not_error = torch.ones_like(w)
        not_error[targets] = 1 - A[:, err].sum(1)
        completeness = float((not_error * weight).sum() / weight.sum())
        return GraphScores(replacement, completeness)

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> "PrunedGraph":
        """Keep the nodes and edges that carry most of the influence (module docstring). Computed on the
        adjacency's rows that can be nonzero (:meth:`rows`), never on an (node, node) matrix of floats.

        Raises:
            ValueError: a threshold outside [0, 1].
        """
        for name, t in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
            if not 0.0 <= float(t) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {t}")
        w, targets, rows = self.logit_weights(), self.target_nodes(), self.rows()
        n_src = rows.shape[1]
        infl = _rows.influence(_rows.normalized(rows), targets, w)
        nodes = infl >= _rows.threshold(infl, node_threshold)
        always = self.n_nodes - self.n_logits - self.n_pos  # tokens and logits stay
        nodes[always:] = True
        kept = rows * nodes[targets][:, None] * nodes[None, :n_src]
        A = _rows.normalized(kept)
        del kept
        edge_scores = A * (_rows.influence(A, targets, w) + w)[targets][:, None]
        edges = (edge_scores >= _rows.threshold(edge_scores, edge_threshold)) & (edge_scores > 0)
        del A, edge_scores
        n_feat = self.n_features
        while True:  # features need an edge in and one out, error nodes one out; each removal can strand others
            before = nodes.clone()
            edges &= nodes[targets][:, None] & nodes[None, :n_src]
            nodes[:always] &= edges[:, :always].any(0)
            nodes[:n_feat] &= edges[:n_feat].any(1)  # the first n_features target rows are the features
            if bool((nodes == before).all()):
                break
        ranked, order = infl.sort(descending=True)
        cumulative = torch.empty_like(infl)
        cumulative[order] = ranked.cumsum(0) / ranked.sum().clamp(min=torch.finfo(ranked.dtype).tiny)
        if isinstance(self.adjacency, RowMatrix):
            edge_matrix = RowMatrix(edges, targets, self.n_nodes)
        else:
            edge_matrix = torch.zeros(self.n_nodes, self.n_nodes, dtype=torch.bool)
            edge_matrix[targets, :n_src] = edges
        return PrunedGraph(self, nodes, edge_matrix, cumulative, node_threshold, edge_threshold)

    def top(self, k: int = 5, decode=None) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` edges with the largest ``|direct effect|``, each ``((source, target), effect)``
        (an edge is a pair of labels, as in :class:`rs_interp.circuits.EdgeEffects`)."""
        return _top(self, self.rows(), k, decode)


def _top(graph: AttributionGraph, rows: torch.Tensor, k: int, decode) -> list[tuple[tuple[str, str], float]]:
    labels, targets = graph.labels(decode), graph.target_nodes()
    flat = rows.flatten()
    idx = flat.abs().topk(min(k, int((flat != 0).sum()))).indices
    n = rows.shape[1]
    return Top(((labels[int(i) % n], labels[int(targets[int(i) // n])]), float(flat[i])) for i in idx)


@dataclass(frozen=True)
class PrunedGraph:
    """The nodes and edges an :class:`AttributionGraph` keeps at two thresholds.

    Attributes:
        graph: the full graph.
        nodes: (node,) which nodes are kept; edges: (node, node) which edges, [target, source].
        cumulative: (node,) each node's cumulative influence rank (the share of the total influence of
            the nodes at least as influential): circuit-tracer's per-node ``influence`` in its JSON.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> p = attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2])).prune(0.8, 0.98)
    >>> p.counts()["token"], p.counts()["logit"]
    (4, 4)
    """

    graph: AttributionGraph
    nodes: Bool[torch.Tensor, " node"]
    edges: Bool[torch.Tensor, "node node"] | RowMatrix
    cumulative: Float[torch.Tensor, " node"]
    node_threshold: float
    edge_threshold: float

    @property
    def n_nodes(self) -> int:
        return int(self.nodes.sum())

    @property
    def n_edges(self) -> int:
        return int(self.edges.sum())

    def counts(self) -> dict[str, int]:
        """Kept nodes by kind, and kept edges."""
        kinds = self.graph.kinds()
        out = {k: sum(1 for i, kind in enumerate(kinds) if kind == k and bool(self.nodes[i]))
               for k in ("feature", "error", "token", "logit")}
        return out | {"edges": self.n_edges}

    def top(self, k: int = 5, decode=None) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` kept edges with the largest ``|direct effect|``, each ``((source, target), effect)``."""
        g = self.graph
        return _top(g, g.rows() * _rows.block(self.edges, g.target_nodes(), g.n_nodes - g.n_logits), k, decode)
