"""An attribution graph drawn with plotly, offline (no frontend, no server): a ``go.Figure`` to show
in a notebook or write as one HTML file (``fig.write_html(path, include_plotlyjs=True)``).

Nodes sit at their prompt position (x) and their layer (y): tokens at the bottom, layer ``l``'s
features and error node at height ``l + 1`` (features spread a little around it, the error node
just below), logits at the top; a node's size grows with its influence. Edges are lines from source
to target, blue where the direct effect is positive and red where it is negative, wider for larger
effects. Hovering a node shows its label, activation and influence. QK attributions attached with
:meth:`~rs_interp.features.AttributionGraph.with_qk` are dashed arcs from key to query at the head's
layer, hovering their midpoint shows the score and its largest query x key entries. The figure draws what it is
given and computes nothing but the layout.
"""

from __future__ import annotations

import math
from typing import Callable

import plotly.graph_objects as go

from .graph import AttributionGraph, PrunedGraph

__all__ = ["graph_figure", "supernode_figure"]

_COLORS = {"feature": "#4c78a8", "error": "#9d9d9d", "token": "#54a24b", "logit": "#e45756"}


def graph_figure(graph: AttributionGraph | PrunedGraph, *, decode: Callable[[int], str] | None = None,
                 title: str | None = None, max_edges: int = 2000) -> go.Figure:
    """The graph's kept nodes and edges (an :class:`~rs_interp.features.AttributionGraph` is pruned at
    circuit-tracer's defaults, 0.8 and 0.98); at most ``max_edges`` edges, the strongest.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> fig = graph_figure(attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2])))
    >>> [t.name for t in fig.data if t.mode == "markers"]
    ['feature', 'error', 'token', 'logit']
    """
    pruned = graph if isinstance(graph, PrunedGraph) else graph.prune()
    g = pruned.graph
    kinds, labels = g.kinds(), g.labels(decode)
    L, P = g.n_layers, g.n_pos
    kept = pruned.nodes.nonzero()[:, 0].tolist()
    xy = _positions(g, kinds, kept)
    fig = go.Figure()
    biggest = _edge_traces(fig, pruned, xy, max_edges)
    if g.qk:  # the attached QK attributions: dashed arcs from each key to its query, at the head's layer
        _qk_traces(fig, g)
    _node_traces(fig, g, kept, labels, xy)
    tick = [decode(int(t)) if decode else str(int(t)) for t in g.tokens]
    counts = pruned.counts()
    fig.update_layout(
        title=title or (f"attribution graph: {counts['feature']} features, {counts['error']} error nodes, "
                        f"{counts['edges']} edges (biggest |effect| {biggest:.3g})"),
        xaxis=dict(tickmode="array", tickvals=list(range(P)), ticktext=[repr(t)[1:-1] for t in tick], title="position"),
        yaxis=dict(tickmode="array", tickvals=list(range(L + 2)),
                   ticktext=["tokens"] + [f"layer {l}" for l in range(L)] + ["logits"]),
        template="plotly_white", height=360 + 60 * L, legend=dict(orientation="h", y=-0.3))
    return fig


def _positions(g: AttributionGraph, kinds: list[str], kept: list[int]) -> dict[int, tuple[float, float]]:
    """Each kept node's (x, y): its position and its layer (module docstring)."""
    L, P = g.n_layers, g.n_pos
    xy: dict[int, tuple[float, float]] = {}
    per_cell: dict[tuple[int, int], list[int]] = {}
    for n in kept:
        if kinds[n] == "feature":
            l, p, _ = g.features[n].tolist()
            per_cell.setdefault((l, p), []).append(n)
    for (l, p), members in per_cell.items():  # a cell's features on a small grid: 0.8 of a position wide, 0.3 high
        cols = max(1, math.ceil(math.sqrt(2 * len(members))))
        rows = math.ceil(len(members) / cols)
        for j, n in enumerate(members):
            r, c = divmod(j, cols)
            xy[n] = (p + (c - (cols - 1) / 2) * 0.8 / max(cols - 1, 1),
                     l + 1.0 + (r - (rows - 1) / 2) * 0.3 / max(rows - 1, 1))
    for n in kept:
        if kinds[n] == "error":
            l, p = divmod(n - g.n_features, P)
            xy[n] = (p, l + 0.7)
        elif kinds[n] == "token":
            xy[n] = (n - g.n_features - L * P, 0.0)
        elif kinds[n] == "logit":
            i = n - (g.n_nodes - g.n_logits)
            xy[n] = (g.position + (i - (g.n_logits - 1) / 2) * 0.3, L + 1.0)
    return xy


def _edge_traces(fig: go.Figure, pruned: PrunedGraph, xy: dict[int, tuple[float, float]], max_edges: int) -> float:
    """The kept edges, the strongest ``max_edges``, as lines in three widths per sign; the biggest |effect|."""
    g = pruned.graph
    targets, sources = pruned.edges.nonzero(as_tuple=True)
    weights = g.adjacency[targets, sources]
    order = weights.abs().argsort(descending=True)[:max_edges]
    biggest = float(weights.abs().max()) if len(weights) else 1.0
    bins = ((0.5, 3.0), (0.15, 1.6), (0.0, 0.7))  # |effect| / the biggest kept -> line width
    for sign, name, color in ((1, "edges +", "rgba(31,119,180,0.5)"), (-1, "edges -", "rgba(214,39,40,0.5)")):
        shown = False
        for b, (floor, width) in enumerate(bins):
            xs, ys = [], []
            for k in order.tolist():
                w = float(weights[k])
                ceiling = bins[b - 1][0] if b else float("inf")
                if (w > 0) != (sign > 0) or not floor * biggest <= abs(w) < ceiling * biggest:
                    continue
                (x0, y0), (x1, y1) = xy[int(sources[k])], xy[int(targets[k])]
                xs += [x0, x1, None]
                ys += [y0, y1, None]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, legendgroup=name,
                                     showlegend=bool(xs) and not shown, hoverinfo="skip",
                                     line=dict(color=color, width=width)))
            shown = shown or bool(xs)
    return biggest


def _qk_traces(fig: go.Figure, g: AttributionGraph) -> None:
    """The attached QK attributions: an arc per head edge, its midpoint hovered for the score and top entries."""
    xs, ys, hx, hy, text = [], [], [], [], []
    for a in g.qk:
        y = a.layer + 0.45
        xs += [a.key, (a.key + a.query) / 2, a.query, None]
        ys += [y, y + 0.25, y, None]
        parts = "<br>".join(f"{qs} x {ks}: {v:.3g}" for (qs, ks), v in a.top(3))
        hx.append((a.key + a.query) / 2)
        hy.append(y + 0.25)
        text.append(f"L{a.layer}H{a.head} {a.query} <- {a.key}: score {a.score:.3g}, "
                    f"pattern {a.pattern:.3g}<br>{parts}")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="attention (QK)", hoverinfo="skip",
                             line=dict(color="rgba(148,103,189,0.8)", width=1.5, dash="dash")))
    fig.add_trace(go.Scatter(x=hx, y=hy, mode="markers", name="QK", text=text, hoverinfo="text", showlegend=False,
                             marker=dict(symbol="diamond", size=8, color="rgba(148,103,189,0.9)")))


def _node_traces(fig: go.Figure, g: AttributionGraph, kept: list[int], labels: list[str],
                 xy: dict[int, tuple[float, float]]) -> None:
    """One marker trace per kind of node, sized by influence, hovered for label, activation and influence."""
    kinds, infl = g.kinds(), g.influence()
    top = float(infl[kept].max()) if kept else 1.0
    for kind, color in _COLORS.items():
        ns = [n for n in kept if kinds[n] == kind]
        text = []
        for n in ns:
            extra = f"<br>activation {float(g.activations[n]):.3g}" if kind == "feature" else ""
            if kind == "logit":
                extra = f"<br>p = {float(g.logit_probabilities[n - (g.n_nodes - g.n_logits)]):.3g}"
            text.append(f"{labels[n]}{extra}<br>influence {float(infl[n]):.3g}")
        sizes = [7 + 18 * float(infl[n]) / top if top > 0 else 7 for n in ns]
        fig.add_trace(go.Scatter(x=[xy[n][0] for n in ns], y=[xy[n][1] for n in ns], mode="markers", name=kind,
                                 text=text, hoverinfo="text",
                                 marker=dict(color=color, line=dict(width=0.5, color="white"), size=sizes)))


def supernode_figure(sg, *, title: str | None = None, max_edges: int = 500) -> go.Figure:
    """A :class:`~rs_interp.features.supernodes.SupernodeGraph` drawn as :func:`graph_figure` draws a graph:
    each supernode at its members' mean position and layer (sized by its member count), its summed
    edges as lines (blue positive, red negative, wider for larger); at most ``max_edges``, the strongest.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> from rs_interp.features.supernodes import supernodes
    >>> model = load_toy_model("tracr-sort")
    >>> fig = supernode_figure(supernodes(attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2]))))
    >>> [t.name for t in fig.data if t.mode == "markers"]
    ['supernodes']
    """
    g = sg.graph
    kinds, L, P = g.kinds(), g.n_layers, g.n_pos

    def place(n: int) -> tuple[float, float]:
        if kinds[n] == "feature":
            l, p, _ = g.features[n].tolist()
            return float(p), l + 1.0
        if kinds[n] == "error":
            l, p = divmod(n - g.n_features, P)
            return float(p), l + 0.7
        if kinds[n] == "token":
            return float(n - g.n_features - L * P), 0.0
        return float(g.position), L + 1.0

    xy = []
    for members in sg.groups:
        pts = [place(n) for n in members]
        xy.append((sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)))
    A = sg.adjacency
    t, s = A.nonzero(as_tuple=True)
    w = A[t, s]
    order = w.abs().argsort(descending=True)[:max_edges]
    biggest = float(w.abs().max()) if len(w) else 1.0
    fig = go.Figure()
    for sign, name, color in ((1, "edges +", "rgba(31,119,180,0.5)"), (-1, "edges -", "rgba(214,39,40,0.5)")):
        for k in order.tolist():
            if (float(w[k]) > 0) != (sign > 0):
                continue
            (x0, y0), (x1, y1) = xy[int(s[k])], xy[int(t[k])]
            width = 0.5 + 3.0 * abs(float(w[k])) / biggest
            fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", name=name, legendgroup=name,
                                     showlegend=False, hoverinfo="skip", line=dict(color=color, width=width)))
    text = [f"{sg.names[i]}<br>{len(m)} node(s)<br>value {float(sg.values[i]):.3g}" for i, m in enumerate(sg.groups)]
    colors = ["#b279a2" if len(m) > 1 else "#9d9d9d" for m in sg.groups]
    fig.add_trace(go.Scatter(x=[x for x, _ in xy], y=[y for _, y in xy], mode="markers", name="supernodes",
                             text=text, hoverinfo="text",
                             marker=dict(color=colors, size=[7 + 3 * min(len(m), 6) for m in sg.groups])))
    fig.update_layout(title=title or f"supernode graph: {sg.n_given} supernodes, {sg.n_groups} nodes, {len(w)} edges",
                      xaxis=dict(title="position"), template="plotly_white", height=360 + 60 * L,
                      yaxis=dict(tickmode="array", tickvals=list(range(L + 2)),
                                 ticktext=["tokens"] + [f"layer {l}" for l in range(L)] + ["logits"]))
    return fig
