"""The circuit diagram draws what it is given: the top edges of a score (or exactly an edge set), each
in the colour of the input it enters, wider with |effect|, dotted when negative, on every model shape."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.ui.circuit_figure import EDGE_COLOURS, circuit_figure
from tests.builders import TL4


def _cfgs():
    out = {"induction-2l": ri.load_toy_model("induction-2l").cfg, "gpt2-small": ri.models.gpt2_config("small"),
           "gqa": ri.models.make_attn_only(2, n_heads=4, n_key_value_heads=2, d_head=8, d_model=32).cfg}
    if not TL4:  # TransformerLens 4.3's native models build no parallel block
        from rs_interp._backend import make_config

        out["parallel"] = make_config(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, d_vocab=50, n_ctx=8,
                                      act_fn="gelu", normalization_type="LN", parallel_attn_mlp=True)
    return out


def _scores(cfg, seed=0):
    layout = ri.edge_layout(cfg)
    g = torch.Generator().manual_seed(seed)
    # |effect| 1, 1/2, 1/3 ... in a random order (the top few spread over the widths), random signs
    size = 1.0 / (1 + torch.randperm(layout.exists.numel(), generator=g).view(layout.exists.shape).double())
    sign = torch.randint(0, 2, layout.exists.shape, generator=g) * 2 - 1
    return ri.circuits.EdgeEffects(layout, torch.where(layout.exists, size * sign, torch.nan), 0.0)


def _kind(receiver: str) -> str:
    return "logits" if receiver == "logits" else "mlp" if receiver.startswith("MLP") else receiver[-1]


def _drawn(fig):
    """(sender, receiver, value, colour, width, dash) per edge: the line traces' segments in order,
    matched with the hover labels of the edges' midpoints (added in the same order)."""
    return [d[:6] for d in _segments(fig)]


def _segments(fig):
    """As :func:`_drawn`, each edge with its points ``[(x, y), ...]`` last (a line trace's edges are separated by
    None)."""
    labels = next(t for t in fig.data if t.name == "edges").text
    out, k = [], 0
    for t in fig.data:
        if t.mode != "lines" or t.x == (None,):
            continue
        points: list = []
        for x, y in zip(t.x, t.y):
            if x is not None:
                points.append((x, y))
                continue
            edge, _, value = labels[k].partition(": ")
            s, r = edge.split(" -> ")
            out.append((s, r, float(value) if value else None, t.line.color, t.line.width, t.line.dash, points))
            points, k = [], k + 1
    assert k == len(labels)
    return out


@pytest.mark.parametrize("which", ["induction-2l", "gpt2-small", "gqa", "parallel"])
def test_an_edge_into_a_head_ends_at_the_head(which):
    """Issue 61: an edge into a query, key or value input ends at its head's (or KV head's) node, where the head reads
    its input, coming in below it from the left, the middle or the right at most PORT_PIXELS beside it on a plot
    PLOT_PIXELS wide (it ended 0.22 x-units beside the head, in empty space: ~80 px on a page with two heads). An edge
    into an MLP or the logits ends just below its node."""
    from rs_interp.ui.circuit_figure import PLOT_PIXELS, PORT_PIXELS

    cfgs = _cfgs()
    if which not in cfgs:
        pytest.skip("TransformerLens 4.3's native models build no parallel block (checked on 3.x)")
    scores = _scores(cfgs[which])
    fig = circuit_figure(scores, max_edges=min(60, scores.layout.n_edges))
    nodes = next(t for t in fig.data if t.name == "nodes")
    at = {label: (x, y) for label, x, y in zip(nodes.text, nodes.x, nodes.y)}
    per_unit = PLOT_PIXELS / (fig.layout.xaxis.range[1] - fig.layout.xaxis.range[0])  # pixels per x unit
    seen = set()
    for s, r, *_, points in _segments(fig):
        node = r.split(".")[0]
        if r in ("logits",) or r.startswith("MLP"):
            assert points[-1][0] == at[node][0] and 0 < at[node][1] - points[-1][1] <= 0.25
            continue
        (xp, yp), end = points[-2], points[-1]
        assert end == at[node], (s, r, points)  # the edge ends at its head
        offset = (xp - end[0]) * per_unit
        assert {"q": offset < 0, "k": offset == 0, "v": offset > 0}[r[-1]] and abs(offset) <= PORT_PIXELS + 1e-9
        assert 0 < end[1] - yp <= 0.25  # it comes in from below
        seen.add(r[-1])
    assert seen == {"q", "k", "v"}


@pytest.mark.parametrize("which", ["induction-2l", "gpt2-small", "gqa", "parallel"])
def test_draws_the_top_edges_of_a_score(which):
    cfgs = _cfgs()
    if which not in cfgs:
        pytest.skip("TransformerLens 4.3's native models build no parallel block (checked on 3.x)")
    scores = _scores(cfgs[which])
    k = min(40, scores.layout.n_edges // 2)
    fig = circuit_figure(scores, max_edges=k)
    drawn = _drawn(fig)
    values = {(s, r): scores.edge(s, r) for s, r in scores.layout.edges()}
    want = sorted(values, key=lambda e: -abs(values[e]))[:k]
    assert sorted((s, r) for s, r, *_ in drawn) == sorted(want)
    for s, r, v, colour, width, dash in drawn:
        assert v == pytest.approx(values[(s, r)], rel=1e-3)
        assert colour == EDGE_COLOURS[_kind(r)]
        assert dash == ("dot" if values[(s, r)] < 0 else "solid")
    by_size = sorted(drawn, key=lambda d: abs(values[(d[0], d[1])]))
    widths = [d[4] for d in by_size]
    assert widths == sorted(widths) and widths[-1] == max(widths) > widths[0]  # wider with |effect|
    assert fig.layout.title.text == f"Circuit: the top {k} of {scores.layout.n_edges} edges by |effect|"
    faint = next(t for t in fig.data if t.name == "components")
    assert set(faint.text) == set(scores.layout.senders) - {"embed"}  # the whole model, faint


def test_draws_exactly_an_edge_set():
    model = ri.load_toy_model("induction-2l")
    edges = [("embed", "L0H1.v"), ("L0H1", "L1H0.k"), ("L1H0", "logits"), ("embed", "L1H0.q")]
    fig = circuit_figure(edges, model)
    drawn = _drawn(fig)
    assert sorted((s, r) for s, r, *_ in drawn) == sorted(edges)
    assert {d[4] for d in drawn} == {circuit_figure.__globals__["_WIDTHS"][1]}  # no scores: every edge alike
    nodes = next(t for t in fig.data if t.name == "nodes")
    assert set(nodes.text) == {"embed", "L0H1", "L1H0", "logits"}
    legend = {t.name for t in fig.data if t.showlegend}  # one entry per kind of input entered
    assert legend == {"into a query", "into a key", "into a value", "into the logits"}


def test_gpt2_small_axis_and_size():
    fig = circuit_figure(_scores(ri.models.gpt2_config("small"), seed=3), max_edges=300)
    assert list(fig.layout.yaxis.ticktext) == ["embed"] + [t for l in range(12) for t in (f"L{l}", f"MLP{l}")] + ["logits"]
    assert len(_drawn(fig)) == 300


def test_refusals():
    model = ri.load_toy_model("induction-2l")
    every = ri.edge_layout(model).edges()
    with pytest.raises(ValueError, match="29 edges are too many to draw readably"):
        circuit_figure(every, model, max_edges=10)
    with pytest.raises(ValueError, match="not upstream"):
        circuit_figure([("L1H0", "L0H0.q")], model)
    with pytest.raises(ValueError, match="'L7H0' is not a sender"):
        circuit_figure([("L7H0", "logits")], model)
    with pytest.raises(ValueError, match="pass the model"):
        circuit_figure([("embed", "logits")])
    with pytest.raises(ValueError, match="another model's edge layout"):
        circuit_figure([("embed", "logits")], model, scores=_scores(ri.models.gpt2_config("small")))
    with pytest.raises(ValueError, match="max_edges"):
        circuit_figure(_scores(model.cfg), max_edges=0)


def test_positional_edges_are_drawn_in_their_spans_columns():
    """Issue 66: a positional score's top edges, each a line inside its span's column (x between the column's
    borders), hover text ``s -> r @ span``, the spans named on the x axis."""
    from rs_interp.circuits.induction_truth import period_spans

    model = ri.load_toy_model("induction-2l")
    a, b = ri.induction_batch(6, seed=0), ri.induction_batch(6, seed=1)
    eap = ri.edge_attribution_patching(model, a.tokens, ri.next_token_loss(a.targets), reference=b.tokens,
                                       spans=period_spans(a.periods, a.tokens.shape[1])).positional()
    fig = circuit_figure(eap, max_edges=8)
    lines = [t for t in fig.data if t.mode == "lines" and t.text]
    want = {f"{s} -> {r} @ {u}" for (s, r, u), v in eap.top(8) if v != 0}
    assert {t.text.split(":")[0] for t in lines} == want
    step = fig.layout.xaxis.range[1] / len(eap.spans)  # the columns: [-0.8, n_spans * step]
    for t in lines:
        column = eap.spans.index(t.text.split(" @ ")[1].split(":")[0])
        assert all(column * step - 0.9 <= x <= (column + 1) * step for x in t.x), t.text
    assert list(fig.layout.xaxis.ticktext) == ["first period", "repeats"]
