"""Long prompts in bounded memory (issue 54 item 2): the adjacency kept as its nonzero rows gives the same graph,
bit for bit, as the dense one; the feature rows kept blockwise read as the full rows; the estimate's refusals.
(The estimate against measured peaks is in benchmarks/bench_features.py: speed and memory goals live there.)
"""

from __future__ import annotations

import json

import pytest
import torch

from rs_interp.features import attribution_graph, estimate_graph, shipped_transcoders
from rs_interp.features._rows import FeatureRows, RowMatrix
from rs_interp.features.export import graph_json
from rs_interp.features.figures import graph_figure
from tests.builders import make_variant
from tests.features.test_transcoders import random_transcoders

CASES = [(None, 64), (30, 4), (12, 7)]


@pytest.mark.parametrize("cap, batch", CASES, ids=[f"cap{c}-batch{b}" for c, b in CASES])
def test_the_row_graph_is_the_dense_graph(cap, batch):
    model = make_variant("LN", "rotary", False, seed=1, n_layers=3)
    tcs = random_transcoders(3, 16, 24, activation="topk", k=5, seed=2)
    tokens = torch.randint(0, 50, (11,), generator=torch.Generator().manual_seed(3))
    dense = attribution_graph(model, tcs, tokens, max_feature_nodes=cap, batch_size=batch, max_logits=3)
    rows = attribution_graph(model, tcs, tokens, max_feature_nodes=cap, batch_size=batch, max_logits=3, dense=False)
    assert isinstance(rows.adjacency, RowMatrix) and isinstance(dense.adjacency, torch.Tensor)
    assert torch.equal(rows.adjacency.dense(), dense.adjacency) and torch.equal(rows.dense_adjacency(), dense.adjacency)
    for f in ("features", "activations", "values", "bias", "unselected", "logit_tokens"):
        assert torch.equal(getattr(rows, f), getattr(dense, f)), f
    assert torch.equal(rows.influence(), dense.influence()) and rows.scores() == dense.scores()
    for thresholds in ((0.8, 0.98), (0.5, 0.9), (1.0, 1.0)):
        a, b = rows.prune(*thresholds), dense.prune(*thresholds)
        assert torch.equal(a.nodes, b.nodes) and torch.equal(a.edges.dense(), b.edges) and torch.equal(a.cumulative, b.cumulative)
        assert a.counts() == b.counts() and a.top(6) == b.top(6)
    assert rows.top(8) == dense.top(8)
    assert json.dumps(graph_json(rows)) == json.dumps(graph_json(dense))
    assert len(graph_figure(rows).data) == len(graph_figure(dense).data)
    # the dense reads the rest of the package makes, answered by the rows
    g = torch.Generator().manual_seed(4)
    t, s = torch.randint(0, dense.n_nodes, (50,), generator=g), torch.randint(0, dense.n_nodes, (50,), generator=g)
    assert torch.equal(rows.adjacency[t, s], dense.adjacency[t, s])
    assert torch.equal(rows.adjacency[t[:5]], dense.adjacency[t[:5]])
    assert torch.equal(rows.adjacency[t[:5], 3], dense.adjacency[t[:5], 3])
    if cap is None:
        assert float(dense.unselected.abs().max()) == 0.0
    else:
        assert dense.n_features == cap and float(dense.unselected.abs().max()) > 0


def test_blockwise_feature_rows_read_as_the_full_rows():
    """Rows stored only over the sources before their layer spread weights as the full rows do, and give
    the same kept columns and unselected sums."""
    g = torch.Generator().manual_seed(0)
    layer_start, n_active, n_tail = [0, 5, 12, 20], 20, 6
    full, blocks = [], FeatureRows(n_active, layer_start, n_tail, torch.float64)
    for layers in ([1, 1, 2], [2, 3], [1]):
        r = torch.randn(len(layers), n_active + n_tail, generator=g, dtype=torch.float64)
        for i, l in enumerate(layers):
            r[i, layer_start[l] : n_active] = 0.0  # a target of layer l reads no feature of layer l or later
        full.append(r)
        blocks.add(r, layers)
    full = torch.cat(full)
    w = torch.rand(len(full), generator=g, dtype=torch.float64)
    a = full.abs()
    assert torch.allclose(blocks.spread(w), (w / a.sum(1)) @ a, rtol=1e-14, atol=0)
    keep = torch.tensor([3, 0, 15, 7])
    dropped = torch.ones(n_active, dtype=torch.float64)
    dropped[keep] = 0
    kept, unselected = blocks.columns(keep, dropped)
    assert torch.equal(kept, torch.cat([full[:, keep], full[:, n_active:]], 1))
    assert torch.allclose(unselected, full[:, :n_active] @ dropped, rtol=1e-14, atol=1e-15)
    bad = torch.zeros(1, n_active + n_tail, dtype=torch.float64)
    bad[0, 13] = 1.0
    with pytest.raises(ValueError, match="causal"):
        blocks.add(bad, [2])


def test_the_estimate_from_the_shapes():
    from rs_interp import load_toy_model

    model, tcs = load_toy_model("code-2l"), shipped_transcoders("code-2l")
    small, big = (estimate_graph(model, tcs, n, max_feature_nodes=64, rate=1e10) for n in (16, 64))
    assert small.n_active == 2 * 16 * tcs[0].k and big.peak_bytes > small.peak_bytes and big.seconds > small.seconds
    assert big.peak_bytes == max(sum(v for k, v in big.parts.items() if k.startswith(p)) for p in ("rows", "assembly", "pruning"))
    rows_only = estimate_graph(model, tcs, 64, max_feature_nodes=64, rate=1e10, dense=False)
    assert rows_only.parts["assembly: dense adjacency"] == 0 and rows_only.peak_bytes <= big.peak_bytes
    relu = random_transcoders(2, 128, 32, seed=0)
    with pytest.raises(ValueError, match="active_per_token"):
        estimate_graph(model, relu, 64)
    assert estimate_graph(model, relu, 64, active_per_token=3, rate=1e10).n_active == 3 * 64 * 2
