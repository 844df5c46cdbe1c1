"""Issue 53 item 3: circuit-tracer's graph-level conventions as options of attribution_graph, each against a
brute force written here (float64, plain hooks on the raw forward: tests/features/test_graph.Frozen).

- zero_positions: no feature node and a zero error vector at those positions; every other entry is still the
  exact direct effect (doubling a node's write in the frozen model moves each target by its column), and the
  bias is the frozen run with every node off but what the zeroed positions' MLP outputs held, so rows sum;
- prepend_bos: circuit-tracer's ``ensure_tokenized`` rule, written out here;
- feature_order and round_size: circuit-tracer's selection loop (``_run_attribution`` with
  ``compute_partial_influences``), written out here on the full graph's rows, chooses the same features in
  the same order; ``"index"`` lists them in their active order, with the same rows.
circuit-tracer itself is compared in tests/integration/test_references_circuit_tracer.py (the optional reference job).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rs_interp.features import attribution_graph, intervene, qk_attributions
from rs_interp.features.export import graph_json
from tests.features.test_graph import Frozen, node_write
from tests.features.test_transcoders import random_transcoders, relu_model

TOL = 1e-9
P = 9


def _rows(g):
    return torch.cat([torch.arange(g.n_features), torch.arange(g.n_nodes - g.n_logits, g.n_nodes)])


@pytest.fixture(scope="module")
def setup():
    model = relu_model("LN", seed=1)
    tokens = torch.randint(4, 50, (P,), generator=torch.Generator().manual_seed(3))
    return model, tokens


ZEROS = [slice(0, 1), slice(0, 4), (0, 5), ()]


@pytest.mark.parametrize("zero", ZEROS, ids=["first", "gemma-it-span", "two", "none"])
@pytest.mark.parametrize("activation, skip", [("relu", False), ("jumprelu", True)], ids=["relu", "jumprelu-skip"])
def test_zero_positions_keep_every_entry_exact(setup, zero, activation, skip):
    model, tokens = setup
    tcs = random_transcoders(2, 16, 24, activation=activation, skip=skip, seed=2)
    g = attribution_graph(model, tcs, tokens, targets=[0, 7], position=-2, zero_positions=zero)
    full = attribution_graph(model, tcs, tokens, targets=[0, 7], position=-2)
    Z = tuple(range(P)[zero]) if isinstance(zero, slice) else tuple(zero)
    assert g.zero_positions == Z
    # the nodes: every active feature but those at Z; the error vectors at Z are 0, the others the full graph's
    keep = [f for f in full.features.tolist() if f[1] not in Z]
    assert g.features.tolist() == keep and g.n_active == len(keep)
    assert bool((g.errors[:, list(Z)] == 0).all()) and torch.equal(g.errors[:, [p for p in range(P) if p not in Z]],
                                                                  full.errors[:, [p for p in range(P) if p not in Z]])
    bf = Frozen(model, tcs, tokens)
    base = bf.targets(g, *bf.run())
    rows = _rows(g)
    assert torch.allclose(g.values[rows], base, atol=TOL, rtol=0)
    picks = torch.randperm(g.n_features, generator=torch.Generator().manual_seed(4))[:6].tolist()
    picks += [g.error_node(l, p) for l, p in ((0, 0), (0, 5), (1, 8), (1, 3))] + [g.token_node(p) for p in (0, 4)]
    for n in picks:
        embed_delta, out_delta = node_write(bf, g, tcs, n, zeroed=Z)
        moved = bf.targets(g, *bf.run(embed_delta=embed_delta, out_delta=out_delta))
        assert torch.allclose(moved - base, g.adjacency[rows, n], atol=TOL, rtol=0), g.labels()[n]
    # every node off, the zeroed positions' MLP outputs as they were: the bias
    off = [-(bf.out[l] - tcs[l].b_dec - tcs[l].skip(bf.x[l])) for l in range(2)]
    for l in range(2):
        off[l][list(Z)] = 0.0
    bias = bf.targets(g, *bf.run(embed_delta=-bf.embed, out_delta=off))
    assert torch.allclose(g.bias[rows], bias, atol=TOL, rtol=0)
    assert torch.allclose(g.adjacency[rows].sum(1) + g.bias[rows] + g.unselected[rows], base, atol=TOL, rtol=0)
    # an intervention on a zeroed error node has nothing to scale: refused; on the others, the graph's prediction holds
    if Z:
        with pytest.raises(ValueError, match="zeroed position"):
            intervene(model, tcs, g, [g.error_node(1, Z[0])], scale=2.0)
    iv = intervene(model, tcs, g, [g.token_node(0), g.error_node(1, 7)], scale=0.5)
    assert iv.gap < TOL
    # the QK attributions follow the graph's zeroed positions: each table sums to its score (checked inside too)
    (a,) = qk_attributions(model, tcs, g, [(1, 0, 7, 2)])
    assert abs(float(a.table.sum()) - a.score) < TOL


def _ensure_tokenized(tokens, tok):
    """circuit-tracer's ``ensure_tokenized`` (replacement_model_transformerlens.py), for ids, written out:
    ``if tokens[0] in all_special_ids: return tokens``; else prepend ``next(filter(None, [bos, pad, eos] +
    all_special_ids))`` (rs_interp takes an id 0 too, where ``filter(None, ...)`` passes over it)."""
    if int(tokens[0]) in tok.all_special_ids:
        return tokens
    first = next(c for c in [tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, *tok.all_special_ids] if c is not None)
    return torch.cat([torch.tensor([first]), tokens])


TOKENIZERS = [dict(bos_token_id=1, pad_token_id=3, eos_token_id=2, all_special_ids=[1, 2, 3]),
              dict(bos_token_id=None, pad_token_id=None, eos_token_id=2, all_special_ids=[2]),
              dict(bos_token_id=None, pad_token_id=None, eos_token_id=None, all_special_ids=[3, 1])]


@pytest.mark.parametrize("tok", TOKENIZERS, ids=["bos", "eos-only", "special-only"])
@pytest.mark.parametrize("first", [None, 1, 2, 3], ids=["word", "id1", "id2", "id3"])
def test_prepend_bos_is_circuit_tracers_rule(setup, tok, first):
    model, tokens = setup
    tokens = tokens.clone()
    if first is not None:
        tokens[0] = first
    tcs = random_transcoders(2, 16, 24, seed=2)
    model.tokenizer = SimpleNamespace(**tok, padding_side="right")
    try:
        expected = _ensure_tokenized(tokens, model.tokenizer)
        g = attribution_graph(model, tcs, tokens, targets=[5], position=3, prepend_bos=True)
    finally:
        model.tokenizer = None
    assert torch.equal(g.tokens, expected)
    assert g.position == 3 + len(expected) - len(tokens)  # position counts in the ids as given
    same = attribution_graph(model, tcs, expected, targets=[5], position=g.position)
    assert torch.equal(g.adjacency, same.adjacency) and torch.equal(g.bias, same.bias)


def test_prepend_bos_by_id(setup):
    model, tokens = setup
    tcs = random_transcoders(2, 16, 24, seed=2)
    g = attribution_graph(model, tcs, tokens, targets=[5], prepend_bos=0)  # id 0 is a BOS like any other here
    assert g.tokens.tolist() == [0] + tokens.tolist()
    again = attribution_graph(model, tcs, g.tokens, targets=[5], prepend_bos=0)  # already first: nothing prepended
    assert torch.equal(again.tokens, g.tokens)
    with pytest.raises(ValueError, match="model's tokenizer"):
        attribution_graph(model, tcs, tokens, prepend_bos=True)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        attribution_graph(model, tcs, tokens, prepend_bos=50)


def _circuit_tracers_choice(full, cap, round_size):
    """circuit-tracer's selection (_run_attribution with compute_partial_influences), written out on the full
    graph's rows (every active feature a node): the order in which it computes the chosen features' rows."""
    n, n_logits = full.n_features, full.n_logits
    logit_rows = full.adjacency[full.n_nodes - n_logits:, : full.n_nodes - n_logits]
    computed: list[int] = []
    visited = torch.zeros(n, dtype=torch.bool)
    while len(computed) < cap:
        edge = torch.cat([logit_rows, full.adjacency[computed, : full.n_nodes - n_logits]]).abs()
        edge = edge / edge.sum(1, keepdim=True).clamp(min=1e-8)
        row_node = list(range(full.n_nodes - n_logits, full.n_nodes)) + computed
        prod = torch.zeros(full.n_nodes, dtype=edge.dtype)
        prod[-n_logits:] = full.logit_probabilities
        influence = torch.zeros(full.n_nodes - n_logits, dtype=edge.dtype)
        for _ in range(128):
            prod = prod[row_node] @ edge
            if not prod.any():
                break
            influence += prod
            prod = torch.cat([prod, torch.zeros(n_logits, dtype=edge.dtype)])
        rank = torch.argsort(influence[:n], descending=True)
        pending = rank[~visited[rank]][: min(round_size, cap - len(computed))]
        computed += pending.tolist()
        visited[pending] = True
    return computed


@pytest.mark.parametrize("cap, round_size", [(12, 4), (12, 5), (20, 7), (12, 64)])
def test_feature_rounds_and_order_are_circuit_tracers(setup, cap, round_size):
    model, tokens = setup
    tcs = random_transcoders(2, 16, 24, seed=3)
    full = attribution_graph(model, tcs, tokens, targets=[3, 11])
    computed = _circuit_tracers_choice(full, cap, round_size)
    chosen = attribution_graph(model, tcs, tokens, targets=[3, 11], max_feature_nodes=cap, batch_size=3, round_size=round_size)
    # rs_interp batches a round's features layer by layer: the same rounds, each in another order
    assert sorted(chosen.features.tolist()) == sorted(full.features[computed].tolist())
    indexed = attribution_graph(model, tcs, tokens, targets=[3, 11], max_feature_nodes=cap, batch_size=3, round_size=round_size,
                                feature_order="index")
    assert indexed.features.tolist() == full.features[sorted(computed)].tolist()  # circuit-tracer's torch.where(visited)
    # the same graph, its features reordered: rows, columns, values, bias and unselected parts permuted alike
    perm = torch.tensor([chosen.feature_node(*f) for f in indexed.features.tolist()])
    nodes = torch.cat([perm, torch.arange(cap, chosen.n_nodes)])
    assert torch.equal(indexed.adjacency, chosen.adjacency[nodes][:, nodes])
    for name in ("values", "bias", "unselected"):
        assert torch.equal(getattr(indexed, name), getattr(chosen, name)[nodes])
    assert torch.equal(indexed.activations, chosen.activations[perm])


def test_the_convention_sets_circuit_tracers_defaults(setup):
    model, tokens = setup
    tcs = random_transcoders(2, 16, 24, seed=3)
    model.tokenizer = SimpleNamespace(**TOKENIZERS[0], padding_side="right")
    try:
        ct = attribution_graph(model, tcs, tokens, targets=[3], max_feature_nodes=10, convention="circuit-tracer")
        by_hand = attribution_graph(model, tcs, tokens, targets=[3], max_feature_nodes=10, zero_positions=slice(0, 1),
                                    prepend_bos=True, feature_order="index", round_size=2048)
        mine = attribution_graph(model, tcs, tokens, targets=[3], max_feature_nodes=10, convention="circuit-tracer",
                                 zero_positions=(), prepend_bos=False, feature_order="selection")  # each option overrides it
    finally:
        model.tokenizer = None
    assert torch.equal(ct.adjacency, by_hand.adjacency) and ct.zero_positions == (0,) and int(ct.tokens[0]) == 1
    assert mine.zero_positions == () and torch.equal(mine.tokens, tokens)


def test_gemma3_it_zeroes_four_positions_and_needs_its_prefix():
    model = relu_model("LN", seed=1, d_vocab=2400)
    tcs = random_transcoders(2, 16, 24, seed=2)
    model.cfg.model_name = "gemma-3-1b-it"
    try:
        prompt = torch.tensor([2, 105, 2364, 107, 9, 40, 41])
        g = attribution_graph(model, tcs, prompt, targets=[3], convention="circuit-tracer")
        assert torch.equal(g.tokens, prompt) and g.zero_positions == (0, 1, 2, 3)
        with pytest.raises(ValueError, match="start_of_turn"):
            attribution_graph(model, tcs, prompt[4:], convention="circuit-tracer")
    finally:
        model.cfg.model_name = "custom"


def test_refusals(setup):
    model, tokens = setup
    tcs = random_transcoders(2, 16, 24, seed=2)
    for kw, match in [(dict(convention="neuronpedia"), "convention must be"), (dict(feature_order="random"), "feature_order"),
                      (dict(round_size=0), "round_size"), (dict(zero_positions=[0, 9]), "zero_positions"),
                      (dict(position=9, prepend_bos=0), "position must be")]:
        with pytest.raises(ValueError, match=match):
            attribution_graph(model, tcs, tokens, **kw)


def test_the_export_writes_circuit_tracers_ids(setup):
    """Its error id ``0_l_p``, and ``l_-1_p`` where that is also a layer-0 feature's id written (circuit-tracer's file
    would then hold two nodes under one id)."""
    model, tokens = setup
    g = attribution_graph(model, random_transcoders(2, 16, 24, seed=2), tokens, targets=[0, 7])
    data = graph_json(g, node_threshold=1.0, edge_threshold=1.0)
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    features = {n["node_id"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"}
    errors = [n for n in data["nodes"] if n["feature_type"] == "mlp reconstruction error"]
    moved = [n for n in errors if n["node_id"] == f"{n['layer']}_-1_{n['ctx_idx']}"]
    assert moved and all(f"0_{n['layer']}_{n['ctx_idx']}" in features for n in moved)
    assert all((n["node_id"], n["jsNodeId"]) == (f"0_{n['layer']}_{n['ctx_idx']}", f"{n['layer']}_{n['ctx_idx']}-0")
               for n in errors if n not in moved)


@pytest.mark.parametrize("kind", ["per-layer", "cross-layer"])
def test_zeroing_moves_those_nodes_columns_into_the_bias(kind):
    """The frozen model does not change with ``zero_positions``: each remaining node keeps the full graph's
    column, and the bias gains exactly the columns of the nodes no longer there (features and error nodes at
    the zeroed positions), for a per-layer set and a cross-layer one (whose features write to later layers)."""
    from rs_interp.features import CrossLayerTranscoder

    model = relu_model("LN", seed=1, n_layers=3)
    tcs = (random_transcoders(3, 16, 20, seed=2) if kind == "per-layer"
           else CrossLayerTranscoder.random(3, 16, 20, seed=2, activation="relu", dtype=torch.float64))
    tokens = torch.randint(4, 50, (P,), generator=torch.Generator().manual_seed(3))
    full = attribution_graph(model, tcs, tokens, targets=[0, 7])
    Z = (0, 3)
    g = attribution_graph(model, tcs, tokens, targets=[0, 7], zero_positions=Z)
    kept = torch.tensor([full.feature_node(*f) for f in g.features.tolist()])
    gone = torch.tensor([n for n in range(full.n_features) if int(full.features[n, 1]) in Z]
                        + [full.error_node(l, p) for l in range(3) for p in Z])
    assert len(kept) + len(gone) - 3 * len(Z) == full.n_features
    cols = torch.cat([kept, torch.arange(full.n_features, full.n_nodes)])
    A, F = g.dense_adjacency(), full.dense_adjacency()
    rows_g, rows_f = _rows(g), torch.cat([kept, torch.arange(full.n_nodes - full.n_logits, full.n_nodes)])
    zeroed_errors = [g.error_node(l, p) for l in range(3) for p in Z]
    expected = F[rows_f][:, cols].clone()
    expected[:, torch.tensor(zeroed_errors) - g.n_features + len(kept)] = 0.0
    assert torch.allclose(A[rows_g], expected, atol=TOL, rtol=0)
    assert torch.allclose(g.bias[rows_g], full.bias[rows_f] + F[rows_f][:, gone].sum(1), atol=TOL, rtol=0)
    assert torch.allclose(g.values[rows_g], full.values[rows_f], atol=TOL, rtol=0)
