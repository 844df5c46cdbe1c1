"""A circuit as a layered diagram: :func:`circuit_figure`, a ``plotly.graph_objects.Figure``.

Rows from the bottom: the embedding, then per layer its heads and its MLP, then the logits (an MLP
shares its heads' row, to their right, in a parallel block). Every head and MLP of the model is a
faint dot, so the circuit's place in the model stays visible; the nodes an edge of the circuit
touches are drawn full and labelled. An edge runs from its sender to the receiving input and ends at
its component: an edge into a head's query, key or value input comes in just below the head, from
its left, its middle or its right (:data:`PORT_PIXELS` beside it, on a plot of :data:`PLOT_PIXELS`),
and ends at the head, in its own colour (q blue, k green, v red; MLP inputs purple, the logits grey). With
scores, an edge's width grows with ``|effect|`` (five steps of ``sqrt(|effect| / largest)``) and a negative
effect is dotted; hovering an edge's middle shows its label and number.

What the ACDC and EAP-IG repositories draw with graphviz, drawn with plotly (the project's figure
library: offline, no system binary): readable for GPT-2 small's 32,491-edge graph cut to a few
hundred edges.

Position-aware edges (a :class:`rs_interp.circuits.positions.PositionalEdgeEffects`) are drawn with one column per
span, left to right, the model's layers in every column: a positional edge runs inside its span's column (the
sender's write at those positions into the receiver's input there); a head's key or value input at one span feeds
the head at that span and the later ones (PEAP's crossing edges, kept inside the head).

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
>>> eap = ri.edge_attribution_patching(model, a, ri.next_token_loss(ri.next_token_targets(a)), reference=b)
>>> fig = circuit_figure(eap, max_edges=10)
>>> type(fig).__name__, fig.layout.title.text
('Figure', 'Circuit: the top 10 of 29 edges by |effect|')
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from ..labels import count_of, node_label, parse

__all__ = ["circuit_figure", "EDGE_COLOURS", "PORT_PIXELS", "PLOT_PIXELS"]

#: Colour of an edge by the input it enters.
EDGE_COLOURS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#d62728", "mlp": "#9467bd", "logits": "#555555"}
_KIND_NAMES = {"q": "into a query", "k": "into a key", "v": "into a value", "mlp": "into an MLP",
               "logits": "into the logits"}
_WIDTHS = (0.8, 1.6, 2.6, 3.8, 5.2)  # five steps of |effect| / max
#: How far beside its head a query or value edge comes in (pixels, on a plot area :data:`PLOT_PIXELS` wide).
PORT_PIXELS = 8.0
#: The plot area's width the port offsets are measured on (pixels: plotly's default figure, 700, less the
#: margins; a wider page widens the offset with it).
PLOT_PIXELS = 620.0


def _parse(label: str) -> tuple[str, int, int]:
    """(kind, layer, index) of a sender or receiver label (:func:`rs_interp.labels.parse`): kind in embed, head, kv,
    mlp, logits."""
    c = parse(label)
    if c.layer is None:
        return c.kind, -1, 0
    return ("kv" if c.kind == "kv_head" else c.kind), c.layer, c.index or 0


def circuit_figure(circuit: Any, model_or_layout: Any = None, *, scores: Any = None, max_edges: int = 400,
                   title: str | None = None) -> go.Figure:
    """Draw a circuit as a layered graph (module docstring).

    Args:
        circuit: an :class:`rs_interp.circuits.EdgeEffects` (its top ``max_edges`` edges by ``|effect|`` are
            drawn, weighted by it), an iterable of ``(sender, receiver)`` edges, or a
            :class:`rs_interp.circuits.positions.PositionalEdgeEffects` (its top positional edges, one column per span).
        model_or_layout: for an edge set, the model, its config or its :class:`rs_interp.circuits.EdgeLayout`
            (taken from ``scores`` or ``circuit`` when they carry one).
        scores: for an edge set, an :class:`rs_interp.circuits.EdgeEffects` whose numbers weight the edges
            (none: every edge drawn alike).
        max_edges: the most edges drawn (readability); an edge set larger than this is refused.
        title: the figure's title (default: what is drawn).

    Raises:
        ValueError: no layout to place the nodes, an edge of another model, an edge set larger than
            ``max_edges``, ``scores`` of another layout, or ``max_edges < 1``.

    Example:
        >>> import rs_interp as ri
        >>> edges = [("embed", "L0H1.v"), ("L0H1", "L1H0.k"), ("L1H0", "logits")]
        >>> fig = circuit_figure(edges, ri.load_toy_model("induction-2l"))
        >>> sorted(t.name for t in fig.data if t.showlegend)
        ['into a key', 'into a value', 'into the logits']
    """
    from ..circuits.positions import PositionalEdgeEffects

    if isinstance(circuit, PositionalEdgeEffects):
        return _positional_figure(circuit, max_edges, title)
    layout, scores, edges, values, what = _drawn_edges(circuit, model_or_layout, scores, max_edges)
    grid = _Grid(layout)
    fig = go.Figure()
    # Every component, faint: the model around the circuit.
    everything = [s for s in layout.senders if s != "embed"]
    fig.add_trace(go.Scatter(x=[grid.place(s)[0] for s in everything], y=[grid.place(s)[1] for s in everything],
                             mode="markers", hoverinfo="text", text=everything, showlegend=False, name="components",
                             marker=dict(size=7, color="#dddddd", symbol=[_symbol(s) for s in everything])))
    _draw_edges(fig, grid, edges, values, weighted=scores is not None)
    _draw_nodes(fig, grid, edges)
    if scores is not None and any(v < 0 for v in values):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="negative effect (dotted)", showlegend=True,
                                 line=dict(color="#555555", dash="dot", width=1.6)))
    rows, names = _rows(grid.L, grid.has_mlp and not grid.parallel)  # an MLP row of its own per layer
    fig.update_yaxes(tickvals=rows, ticktext=names, range=[-0.8, 2 * grid.L + 1.8], showgrid=False, zeroline=False)
    fig.update_xaxes(visible=False, range=[-0.8, grid.H + (1.6 if grid.parallel else 0.4)])
    width_note = "; width: |effect|" if scores is not None else ""
    fig.update_layout(title=title or f"Circuit: {what}", height=160 + 34 * len(rows), plot_bgcolor="#ffffff",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, title_text=f"edges{width_note}"),
                      margin=dict(l=60, r=20, t=90, b=30))
    return fig


def _drawn_edges(circuit: Any, model_or_layout: Any, scores: Any, max_edges: Any) -> tuple:
    """(layout, scores, the edges drawn in the graph's order, their values, what is drawn), the arguments checked."""
    from ..circuits.graph import EdgeEffects, EdgeLayout, edge_layout
    from ..circuits.selection import top_edges

    if not isinstance(max_edges, int) or max_edges < 1:
        raise ValueError(f"max_edges must be a positive integer, got {max_edges!r}")
    weighted = isinstance(circuit, EdgeEffects)
    if weighted:
        scores = circuit
    layout = model_or_layout if model_or_layout is not None else getattr(scores, "layout", None)
    if layout is None:
        raise ValueError("pass the model (or its edge layout) to place an edge set's nodes")
    if not isinstance(layout, EdgeLayout):
        layout = edge_layout(layout)
    if scores is not None and (scores.layout.senders != layout.senders or scores.layout.receivers != layout.receivers):
        raise ValueError("scores belong to another model's edge layout")
    total = layout.n_edges
    if weighted:
        finite = scores.effect[layout.exists].nan_to_num(0.0)
        n = min(max_edges, int((finite != 0).sum()))
        edges = sorted(top_edges(scores, n), key=layout.index)
        what = f"the top {n} of {total} edges by |effect|"
    else:
        edges = sorted({tuple(e) for e in circuit}, key=layout.index)  # index() refuses unknown labels and non-edges
        if len(edges) > max_edges:
            raise ValueError(f"{len(edges)} edges are too many to draw readably (max_edges={max_edges}): draw the top "
                             "ones (rs_interp.top_edges) or raise max_edges")
        what = f"{len(edges)} of {total} edges"
    values = [scores.edge(*e) for e in edges] if scores is not None else [1.0] * len(edges)
    return layout, scores, edges, values, what


class _Grid:
    """Where every component sits: heads of layer l at (h, 2l + 1), its MLP at (centre, 2l + 2), or beside the heads
    in a parallel block (one depth there: no edge runs between them)."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.L = max((_parse(s)[1] for s in layout.senders), default=-1) + 1
        self.H = count_of(layout.senders, "head", layer=0)
        self.has_mlp = "MLP0" in layout.senders
        self.parallel = self.has_mlp and not bool(layout.exists[layout.senders.index("L0H0"),
                                                                layout.receivers.index("MLP0")])
        self.centre = (self.H - 1) / 2
        # the x axis spans H + 1.2 (parallel: + 2.4) units: a port's offset in units is PORT_PIXELS on PLOT_PIXELS
        self.beside = PORT_PIXELS / PLOT_PIXELS * (self.H + (2.4 if self.parallel else 1.2))

    def place(self, label: str) -> tuple[float, float]:
        kind, layer, i = _parse(label)
        if kind == "embed":
            return self.centre, 0.0
        if kind == "logits":
            return self.centre, 2.0 * self.L + 1
        if kind == "mlp":
            return (self.H + 0.5, 2.0 * layer + 1) if self.parallel else (self.centre, 2.0 * layer + 2)
        if kind == "kv":  # a KV head's input: under the middle of its group's query heads
            return _kv_x(self.layout, self.H, layer, i, 0.0), 2.0 * layer + 1
        return float(i), 2.0 * layer + 1

    def port(self, receiver: str) -> tuple[list[float], list[float], str]:
        """The edge's last points: into a head's input, below the head (left, middle, right) and then the head."""
        x, y = self.place(receiver)
        if receiver == "logits" or receiver.startswith("MLP"):
            return [x], [y - 0.25], "logits" if receiver == "logits" else "mlp"
        kind = receiver[-1]
        return [x + {"q": -self.beside, "k": 0.0, "v": self.beside}[kind], x], [y - 0.22, y], kind


def _kv_x(layout: Any, H: int, layer: int, i: int, x0: float) -> float:
    """A KV head's x: under the middle of its group's query heads."""
    group = H // count_of(layout.receivers, "kv_head", layer=layer, input="k")
    return x0 + i * group + (group - 1) / 2


def _symbol(label: str) -> str:
    return "square" if label.startswith("MLP") else "circle"


def _width_step(v: float, top: float) -> int:
    # sqrt steps: an edge a quarter of the largest is drawn half as wide, not a fifth
    return min(4, max(0, math.ceil(5 * math.sqrt(abs(v) / top)) - 1))


def _draw_edges(fig: go.Figure, grid: _Grid, edges: list, values: list, *, weighted: bool) -> None:
    """The edges, one trace per (input kind, width step, sign), each kind's legend entry, and the hover points at
    the edges' middles."""
    top = max((abs(v) for v in values if not math.isnan(v)), default=0.0) or 1.0
    groups: dict[tuple[str, int, bool], list[tuple[str, str, float]]] = {}
    for (s, r), v in zip(edges, values):
        step = 0 if not weighted or math.isnan(v) else _width_step(v, top)
        groups.setdefault((grid.port(r)[2], step if weighted else 1, v < 0), []).append((s, r, v))
    shown: set[str] = set()
    mids_x, mids_y, mids_text = [], [], []
    for kind in EDGE_COLOURS:
        for (k, step, negative), members in sorted(groups.items()):
            if k != kind:
                continue
            xs, ys = [], []
            for s, r, v in members:
                x0, y0 = grid.place(s)
                x1, y1, _ = grid.port(r)
                xs += [x0, *x1, None]
                ys += [y0 + (0.15 if s != "embed" else 0.0), *y1, None]
                mids_x.append((x0 + x1[0]) / 2)
                mids_y.append((y0 + y1[0]) / 2)
                mids_text.append(f"{s} -> {r}" + (f": {v:.4g}" if weighted else ""))
            line = dict(color=EDGE_COLOURS[kind], width=_WIDTHS[step], dash="dot" if negative else "solid")
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=_KIND_NAMES[kind], legendgroup=kind,
                                     showlegend=False, hoverinfo="skip", opacity=0.75, line=line))
            shown.add(kind)
        if kind in shown:  # the legend's entry: solid and of middle width, whatever the kind's first edge is
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=_KIND_NAMES[kind], legendgroup=kind,
                                     showlegend=True, line=dict(color=EDGE_COLOURS[kind], width=_WIDTHS[2])))
    fig.add_trace(go.Scatter(x=mids_x, y=mids_y, mode="markers", marker=dict(size=9, opacity=0), hoverinfo="text",
                             text=mids_text, showlegend=False, name="edges"))


def _draw_nodes(fig: go.Figure, grid: _Grid, edges: list) -> None:
    """The circuit's nodes, full and labelled."""
    ends = {"embed", "logits"}
    touched = {s for s, _ in edges} | {node_label(r) for _, r in edges} | ends
    nodes = sorted(touched, key=lambda n: grid.place(n)[::-1])
    symbols = ["square" if n.startswith("MLP") else "diamond" if n in ends else "circle" for n in nodes]
    fig.add_trace(go.Scatter(x=[grid.place(n)[0] for n in nodes], y=[grid.place(n)[1] for n in nodes],
                             mode="markers+text", text=nodes, textposition="middle right", textfont=dict(size=10),
                             hoverinfo="text", showlegend=False, name="nodes",
                             marker=dict(size=[16 if n in ends else 11 for n in nodes], color="#ffffff",
                                         line=dict(color="#222222", width=1.5), symbol=symbols)))


def _rows(L: int, split: bool) -> tuple[list[float], list[str]]:
    """The y axis's rows and their names: the embedding, each layer's heads (and its MLP's row where ``split``),
    the logits."""
    per_layer = [(2.0 * l + 1, 2.0 * l + 2) if split else (2.0 * l + 1,) for l in range(L)]
    rows = [0.0] + [y for ys in per_layer for y in ys] + [2.0 * L + 1]
    names = ["embed"] + [t for l in range(L) for t in ((f"L{l}", f"MLP{l}") if split else (f"L{l}",))] + ["logits"]
    return rows, names


def _positional_figure(scores: Any, max_edges: int, title: str | None) -> go.Figure:
    """The top ``max_edges`` positional edges of ``scores`` by ``|effect|``, one column of the model per span
    (module docstring)."""
    if not isinstance(max_edges, int) or max_edges < 1:
        raise ValueError(f"max_edges must be a positive integer, got {max_edges!r}")
    layout, spans = scores.layout, scores.spans
    picked = [(e, v) for e, v in scores.top(min(max_edges, scores.n_edges)) if v != 0 and not math.isnan(v)]
    cols = _Columns(layout)
    fig = go.Figure()
    faint = [(c, u) for u in range(len(spans)) for c in layout.senders if c != "embed"]  # the model in every column
    fig.add_trace(go.Scatter(x=[cols.place(c, u)[0] for c, u in faint], y=[cols.place(c, u)[1] for c, u in faint],
                             mode="markers", hoverinfo="text", text=[f"{c} @ {spans[u]}" for c, u in faint],
                             showlegend=False, name="components",
                             marker=dict(size=6, color="#dddddd", symbol=[_symbol(c) for c, _ in faint])))
    for u in range(1, len(spans)):  # the columns' borders
        fig.add_vline(x=u * cols.step - 0.9, line=dict(color="#eeeeee", width=1))
    _draw_positional_edges(fig, cols, picked, spans)
    nodes = sorted({(s, u) for (s, _, u), _ in picked} | {(node_label(r), u) for (_, r, u), _ in picked})
    xy = [cols.place(n, spans.index(u)) for n, u in nodes]
    fig.add_trace(go.Scatter(x=[x for x, _ in xy], y=[y for _, y in xy], mode="markers+text",
                             text=[n for n, _ in nodes], textposition="middle right", textfont=dict(size=9),
                             hoverinfo="text", showlegend=False, name="nodes",
                             marker=dict(size=10, color="#ffffff", line=dict(color="#222222", width=1.5))))
    rows, names = _rows(cols.L, cols.has_mlp)
    H, step = cols.H, cols.step
    fig.update_yaxes(tickvals=rows, ticktext=names, range=[-0.8, 2 * cols.L + 1.8], showgrid=False, zeroline=False)
    fig.update_xaxes(tickvals=[u * step + (H - 1) / 2 for u in range(len(spans))], ticktext=list(spans), showgrid=False,
                     zeroline=False, range=[-0.8, len(spans) * step])
    what = f"the top {len(picked)} of {scores.n_edges} positional edges by |effect|"
    fig.update_layout(title=title or f"Circuit by position: {what}",
                      height=160 + 34 * len(rows), width=max(700, 90 * len(spans) * max(H, 2)), plot_bgcolor="#ffffff",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, title_text="edges; width: |effect|"),
                      margin=dict(l=60, r=20, t=90, b=40))
    return fig


class _Columns:
    """Where every component sits in span ``u``'s column: the model's grid shifted by ``u`` columns of ``H + 1.5``."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.L = max((_parse(s)[1] for s in layout.senders), default=-1) + 1
        self.H = count_of(layout.senders, "head", layer=0)
        self.has_mlp = "MLP0" in layout.senders
        self.step = self.H + 1.5  # one span's column: its heads, then a gap

    def place(self, label: str, u: int) -> tuple[float, float]:
        kind, layer, i = _parse(label)
        x0 = u * self.step
        centre = x0 + (self.H - 1) / 2
        if kind in ("embed", "logits"):
            return centre, 0.0 if kind == "embed" else 2.0 * self.L + 1
        if kind == "mlp":
            return centre, 2.0 * layer + 2
        if kind == "kv":
            return _kv_x(self.layout, self.H, layer, i, x0), 2.0 * layer + 1
        return x0 + i, 2.0 * layer + 1


def _draw_positional_edges(fig: go.Figure, cols: _Columns, picked: list, spans: Any) -> None:
    """Each positional edge inside its span's column, coloured by the input it enters, and each kind's legend entry."""
    top = max((abs(v) for _, v in picked), default=1.0) or 1.0

    def kind_of(receiver: str) -> str:
        c = parse(receiver)
        return c.input or c.kind

    for kind in EDGE_COLOURS:
        members = [(e, v) for e, v in picked if kind_of(e[1]) == kind]
        for (s, r, u), v in members:
            x0, y0 = cols.place(s, spans.index(u))
            x1, y1 = cols.place(node_label(r), spans.index(u))
            x1 += {"q": -0.22, "k": 0.0, "v": 0.22}.get(kind, 0.0)
            line = dict(color=EDGE_COLOURS[kind], width=_WIDTHS[_width_step(v, top)], dash="dot" if v < 0 else "solid")
            fig.add_trace(go.Scatter(x=[x0, x1], y=[y0 + 0.15, y1 - 0.22], mode="lines", hoverinfo="text", opacity=0.75,
                                     text=f"{s} -> {r} @ {u}: {v:.4g}", showlegend=False, legendgroup=kind, line=line))
        if members:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=_KIND_NAMES[kind], legendgroup=kind,
                                     line=dict(color=EDGE_COLOURS[kind], width=_WIDTHS[2])))
