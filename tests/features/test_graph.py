"""Attribution graphs (issue 46): every entry is an exact direct effect in the frozen replacement model.

The brute force here is written apart from rs_interp.features: a clean ``run_with_cache``, then plain
hooks on the raw forward that put back every attention pattern and norm scale of the clean run and
every MLP output (plus the transcoder's skip on the moved input, plus the change made); the MLP's input
is recomputed from ``hook_resid_mid`` by writing the norm out from the config with the clean scale.
Everything in float64, to 1e-9 (circuit-tracer checks the same at 5e-4 in float32).
"""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.features import attribution_graph, intervene, mlp_transcoders, shipped_transcoders
from rs_interp.features.export import save_graph_json
from rs_interp.features.figures import graph_figure
from tests.builders import NORMALIZATIONS, POSITIONS, make_variant, other_version_record
from tests.features.test_transcoders import _mlp_input, random_transcoders, relu_model

TOL = 1e-9


class Frozen:
    """The frozen replacement model by brute force, for one prompt."""

    def __init__(self, model, tcs, tokens):
        self.model, self.tcs, self.tokens = model, tcs, tokens[None]
        _, cache = model.run_with_cache(self.tokens)
        self.cache = {k: v.detach() for k, v in cache.items()}
        self.norm = model.cfg.normalization_type
        L = model.cfg.n_layers
        self.x = [self.mlp_in(l, self.cache[f"blocks.{l}.hook_resid_mid"])[0] for l in range(L)]
        self.out = [self.cache[f"blocks.{l}.hook_mlp_out"][0] for l in range(L)]
        self.embed = self.cache["hook_embed"][0]

    def mlp_in(self, l, resid):
        scale = self.cache.get(f"blocks.{l}.ln2.hook_scale")
        return _mlp_input(self.model, l, resid, scale)

    def run(self, *, embed_delta=None, out_delta=None):
        """Targets' inputs (per layer, (pos, d_model)) and logits (pos, vocab) of the frozen run."""
        model, box = self.model, {}
        frozen = [n for n in self.cache if n.endswith(("attn.hook_pattern", "hook_scale"))]
        hooks = [(n, lambda t, hook: self.cache[hook.name]) for n in frozen]
        if embed_delta is not None:
            hooks.append(("hook_embed", lambda t, hook: t + embed_delta[None]))
        for l in range(model.cfg.n_layers):
            hooks.append((f"blocks.{l}.hook_resid_mid", lambda t, hook, l=l: box.__setitem__(l, self.mlp_in(l, t)[0])))

            def out(t, hook, l=l):
                new = self.out[l] + self.skip(l, box) - self.skip(l, self.x)
                return (new + (0 if out_delta is None else out_delta[l]))[None]
            hooks.append((f"blocks.{l}.hook_mlp_out", out))
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(self.tokens)[0]
        return [box[l] for l in range(model.cfg.n_layers)], logits

    def skip(self, l, xs):
        """What the skip paths write into MLP output ``l`` from the inputs ``xs`` (indexed by layer)."""
        return self.tcs[l].skip(xs[l])

    def pre(self, l, x, f):
        """Feature ``f``'s pre-activation at layer ``l``'s input ``x`` (d_model,)."""
        return x @ self.tcs[l].W_enc[f] + self.tcs[l].b_enc[f]

    def targets(self, graph, xs, logits):
        pre = [self.pre(l, xs[l][p], f) for l, p, f in graph.features.tolist()]
        last = logits[graph.position]
        return torch.cat([torch.stack(pre) if pre else last[:0], (last - (last.mean() if graph.centered else 0))[graph.logit_tokens]])


def node_write(bf, graph, tcs, n, zeroed=()):
    """``(embed_delta, out_delta)``: the write of node ``n`` of ``graph`` in the brute force ``bf`` (a
    :class:`Frozen`-like object with the clean run's ``out``, ``x`` and ``embed``): a feature's activation
    times its decoder row, an error node's MLP output minus the transcoder's (nothing at a ``zeroed``
    position), a token's embedding; added once more, it doubles the node."""
    L, (P, d) = len(bf.out), bf.out[0].shape
    out_delta, embed_delta = torch.zeros(L, P, d, dtype=torch.float64), torch.zeros(P, d, dtype=torch.float64)
    kind = graph.kinds()[n]
    if kind == "feature":
        l, p, f = graph.features[n].tolist()
        out_delta[l, p] = graph.activations[n] * tcs[l].W_dec[f]
    elif kind == "error":
        l, p = divmod(n - graph.n_features, P)
        out_delta[l, p] = 0 if p in zeroed else bf.out[l][p] - tcs[l](bf.x[l][p])  # a zeroed error node writes nothing
    else:
        embed_delta[n - graph.token_node(0)] = bf.embed[n - graph.token_node(0)]
    return embed_delta, out_delta


def assert_columns(bf, graph, nodes, feature_write, base, tol):
    """Doubling each of ``nodes``' write in the brute force ``bf`` (a :class:`Frozen`) moves the targets from
    ``base`` by the node's column of ``graph``: a feature's write given by ``feature_write(n)`` ((layer, pos,
    d_model), every MLP output it writes to), an error node's its error vector, a token's its embedding."""
    kinds, (L, P, d) = graph.kinds(), graph.errors.shape
    for n in nodes:
        out_delta, embed_delta = torch.zeros(L, P, d, dtype=torch.float64), torch.zeros(P, d, dtype=torch.float64)
        if kinds[n] == "feature":
            out_delta = feature_write(n)
        elif kinds[n] == "error":
            l, p = divmod(n - graph.n_features, P)
            out_delta[l, p] = graph.errors[l, p]
        else:
            embed_delta[n - graph.token_node(0)] = bf.embed[n - graph.token_node(0)]
        moved = bf.targets(graph, *bf.run(embed_delta=embed_delta, out_delta=out_delta))
        assert torch.allclose(moved - base, graph.adjacency[_rows(graph), n], atol=tol, rtol=0), graph.labels()[n]


def _rows(graph):
    return torch.cat([torch.arange(graph.n_features), torch.arange(graph.n_nodes - graph.n_logits, graph.n_nodes)])


MLP_VARIANTS = [(n, p) for n in NORMALIZATIONS for p in POSITIONS]
TRANSCODERS = [("relu", False), ("jumprelu", True), ("topk", False), ("relu", True)]


@pytest.mark.parametrize("norm, pos", MLP_VARIANTS, ids=[f"{n or 'none'}-{p}" for n, p in MLP_VARIANTS])
@pytest.mark.parametrize("activation, skip", TRANSCODERS, ids=[f"{a}{'-skip' if s else ''}" for a, s in TRANSCODERS])
def test_entries_are_exact_direct_effects(norm, pos, activation, skip):
    """Doubling a node's write (a feature's activation, an error vector, a token's embedding) moves every
    feature's pre-activation and every logit by exactly its column of the graph; and every row plus its
    bias is the target's value, the bias measured with every node off."""
    model = make_variant(norm, pos, False, seed=1)
    tcs = random_transcoders(2, 16, 24, activation=activation, skip=skip, seed=2)
    tokens = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tcs, tokens, targets=[0, 7, 21], position=-2)
    bf = Frozen(model, tcs, tokens)
    base = bf.targets(g, *bf.run())
    rows = _rows(g)
    assert torch.allclose(g.values[rows], base, atol=TOL, rtol=0)
    # the errors, by hand: the MLP output minus the transcoder's reconstruction on the clean input
    for l in range(2):
        assert torch.allclose(g.errors[l], bf.out[l] - tcs[l](bf.x[l]), atol=TOL, rtol=0)
    kinds = g.kinds()
    gen = torch.Generator().manual_seed(4)
    feats = torch.randperm(g.n_features, generator=gen)[:8].tolist()
    errs = [g.error_node(l, p) for l, p in ((0, 0), (0, 5), (1, 8), (1, 3))]
    toks = [g.token_node(p) for p in (0, 4, 8)]
    assert g.n_features > 20 and all(kinds[n] == "feature" for n in feats)
    for n in feats + errs + toks:
        embed_delta, out_delta = node_write(bf, g, tcs, n)
        moved = bf.targets(g, *bf.run(embed_delta=embed_delta, out_delta=out_delta))
        assert torch.allclose(moved - base, g.adjacency[rows, n], atol=TOL, rtol=0), f"node {g.labels()[n]}"
    # every node switched off: the bias
    off = [-(bf.out[l] - tcs[l].b_dec - tcs[l].skip(bf.x[l])) for l in range(2)]
    bias = bf.targets(g, *bf.run(embed_delta=-bf.embed, out_delta=off))
    assert torch.allclose(g.bias[rows], bias, atol=TOL, rtol=0)
    assert torch.allclose(g.adjacency[rows].sum(1) + g.bias[rows], base, atol=TOL, rtol=0)
    assert float(g.unselected.abs().max()) == 0.0


@pytest.mark.parametrize("norm", ["LN", "RMSPre", None])
def test_the_frozen_model_is_linear(norm):
    """Hessian-vector products of a readout of the frozen model, in the token embeddings and the MLP
    outputs, vanish (patterns and scales detached on the raw forward, each MLP output a free input);
    without the freezes they do not (so the check can fail)."""
    model = make_variant(norm, "standard", False, seed=5)
    tokens = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(6))
    r = torch.randn(1, 8, model.cfg.d_vocab, dtype=torch.float64, generator=torch.Generator().manual_seed(7))

    def readout(freeze):
        leaves = {}

        def leaf(name):
            def hook(t, hook):
                leaves[name] = t.detach().requires_grad_(True)
                return leaves[name]
            return hook

        hooks = [("hook_embed", leaf("embed"))] + [(f"blocks.{l}.hook_mlp_out", leaf(l)) for l in range(2)]
        if freeze:
            hooks += [(n, lambda t, hook: t.detach()) for n in model.hook_dict if n.endswith(("hook_pattern", "hook_scale"))]
        with model.hooks(fwd_hooks=hooks):
            value = (model(tokens) * r).sum()
        return value, [leaves["embed"], leaves[0], leaves[1]]

    for freeze in (True, False):
        value, xs = readout(freeze)
        grads = torch.autograd.grad(value, xs, create_graph=True)
        v = [torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(8)) for x in xs]
        dot = sum((g * w).sum() for g, w in zip(grads, v))
        hvp = torch.autograd.grad(dot, xs, allow_unused=True) if dot.requires_grad else [None] * 3
        size = max(0.0 if h is None else float(h.abs().max()) for h in hvp)
        if freeze:
            assert size <= TOL, size
        else:
            assert size > 1e-4, "the unfrozen model is not linear"


def test_the_librarys_intervention_matches_its_graph():
    """``intervene`` in the frozen model: its changes are the graph's columns; live, it runs the model
    itself (checked against a plain-hook run) and the graph is only a first-order prediction."""
    model = relu_model("LN", seed=7)
    tcs = random_transcoders(2, 16, 24, skip=True, seed=8)
    tokens = torch.randint(0, 50, (8,), generator=torch.Generator().manual_seed(9))
    g = attribution_graph(model, tcs, tokens, targets=[1, 2])
    nodes = [0, g.n_features // 2, g.error_node(0, 3), g.token_node(2)]
    iv = intervene(model, tcs, g, nodes, scale=3.0)
    assert iv.gap <= TOL and float(iv.actual.abs().max()) > 1e-3
    (label, actual, predicted), *_ = iv.top(3)
    i = int(iv.actual.abs().argmax())
    assert (label, actual, predicted) == (iv.labels[i], float(iv.actual[i]), float(iv.predicted[i]))
    (edge, weight), *_ = g.top(3)
    t, s = divmod(int(g.adjacency.abs().argmax()), g.n_nodes)
    assert edge == (g.labels()[s], g.labels()[t]) and weight == float(g.adjacency[t, s])
    set_to = intervene(model, tcs, g, [5], value=float(g.activations[5]) * 3.0)
    assert torch.allclose(set_to.actual, g.adjacency[_rows(g), 5] * 2.0, atol=TOL, rtol=0)
    # live: the feature's write (new - current activation) W_dec added to its MLP's output, nothing frozen
    live = intervene(model, tcs, g, [5], value=0.0, frozen=False)
    l, p, f = g.features[5].tolist()
    box, scales = {}, {}

    def mlp_out(t, hook):
        k = int(hook.name.split(".")[1])
        box[k] = _mlp_input(model, k, box[("r", k)], scales[k])[0]  # this run's MLP input, its own scale
        if k != l:
            return t
        t = t.clone()
        t[0, p] -= tcs[l].encode(box[l][p])[f] * tcs[l].W_dec[f]  # set to 0: minus the current activation's write
        return t

    hooks = ([(f"blocks.{k}.hook_resid_mid", lambda t, hook, k=k: box.__setitem__(("r", k), t)) for k in range(2)]
             + [(f"blocks.{k}.ln2.hook_scale", lambda t, hook, k=k: scales.__setitem__(k, t)) for k in range(2)]
             + [(f"blocks.{k}.hook_mlp_out", mlp_out) for k in range(2)])
    bf = Frozen(model, tcs, tokens)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(tokens[None])[0]
    xs = [box[k] for k in range(2)]
    assert torch.allclose(live.after, bf.targets(g, xs, logits), atol=TOL, rtol=0)
    assert not live.frozen and live.gap > 1e-6


def test_selected_features_keep_every_row_exact():
    """With ``max_feature_nodes`` the rows of the chosen features are the full graph's, and what the
    others contributed is kept in ``unselected``: rows still sum to their values."""
    model = make_variant("LN", "standard", False, seed=2)
    tcs = random_transcoders(2, 16, 24, seed=3)
    tokens = torch.randint(0, 50, (10,), generator=torch.Generator().manual_seed(4))
    full = attribution_graph(model, tcs, tokens, targets=[3])
    part = attribution_graph(model, tcs, tokens, targets=[3], max_feature_nodes=12, batch_size=5)
    assert part.n_features == 12 and part.n_active == full.n_active > 12
    idx = torch.tensor([full.feature_node(*f) for f in part.features.tolist()])
    cols = torch.cat([idx, torch.arange(full.n_features, full.n_nodes - full.n_logits)])
    assert torch.allclose(part.adjacency[:12, : part.n_nodes - 1], full.adjacency[idx][:, cols], atol=TOL, rtol=0)
    rows = _rows(part)
    assert torch.allclose(part.adjacency[rows].sum(1) + part.unselected[rows] + part.bias[rows], part.values[rows], atol=TOL, rtol=0)
    # one round chooses all 12 (a round is at least 4 batches): the most influential through the logit row alone,
    # that is its 12 largest |effects|
    logit_row = full.adjacency[-1, : full.n_features].abs()
    assert {tuple(f) for f in part.features.tolist()} == {tuple(full.features[i].tolist()) for i in logit_row.topk(12).indices.tolist()}
    # with rounds of 4 batches of 2, the first round's 8 are the logit row's top 8
    small = attribution_graph(model, tcs, tokens, targets=[3], max_feature_nodes=12, batch_size=2)
    assert {tuple(f) for f in small.features[:8].tolist()} == {tuple(full.features[i].tolist()) for i in logit_row.topk(8).indices.tolist()}


# --- influence, pruning, scores --------------------------------------------------------------------


@pytest.fixture(scope="module")
def code_graph():
    model = ri.load_toy_model("code-2l")
    tokens = ri.induction_batch(1, seed=3, d_vocab=2048, seq_len=24).tokens[0]
    return model, attribution_graph(model, shipped_transcoders("code-2l"), tokens)


def test_influence_is_the_sum_of_paths(code_graph):
    """Influence = w Â (I - Â)^-1 (the series summed in closed form), and the scores recomputed from it."""
    _, g = code_graph
    A = g.adjacency.double().abs()
    A = A / A.sum(1, keepdim=True).clamp(min=1e-300)
    w = g.logit_weights().double()
    closed = w @ A @ torch.linalg.inv(torch.eye(len(w), dtype=torch.float64) - A)
    assert torch.allclose(g.influence().double(), closed, atol=1e-5 * float(closed.abs().max()))
    err = slice(g.n_features, g.n_features + g.n_layers * g.n_pos)
    tok = slice(err.stop, err.stop + g.n_pos)
    s = g.scores()
    assert s.replacement == pytest.approx(float(closed[tok].sum() / (closed[tok].sum() + closed[err].sum())), rel=1e-4)
    weight = closed + w
    assert s.completeness == pytest.approx(float(((1 - A[:, err].sum(1)) * weight).sum() / weight.sum()), rel=1e-4)
    assert 0 < s.replacement < 1 and 0 < s.completeness < 1


def test_pruning_keeps_what_carries_the_influence(code_graph):
    _, g = code_graph
    p = g.prune(0.8, 0.98)
    infl = g.influence()
    n_fixed = g.n_pos + g.n_logits
    assert bool(p.nodes[-n_fixed:].all()), "tokens and logits are always kept"
    kept_features = p.nodes[: g.n_features]
    assert 0 < int(kept_features.sum()) < g.n_features
    # any kept feature is at least as influential as every dropped feature that was not stranded
    assert float(infl[: g.n_features][kept_features].min()) >= 0
    assert bool((p.edges <= (p.nodes[:, None] & p.nodes[None, :])).all()), "edges only between kept nodes"
    assert bool((g.adjacency[p.edges] != 0).all())
    # every kept feature has an edge in and an edge out; every kept error node one out
    assert bool(p.edges[: g.n_features][kept_features].any(1).all())
    assert bool(p.edges[:, : g.n_features][:, kept_features].any(0).all())
    everything = g.prune(1.0, 1.0)
    assert everything.n_edges >= p.n_edges and everything.n_nodes >= p.n_nodes
    with pytest.raises(ValueError, match="node_threshold"):
        g.prune(1.5)


# --- the two TransformerLens versions, the JSON, the figure, refusals ----------------------------------


@pytest.mark.cross_version
def test_both_versions_give_the_same_graph(code_graph):
    _, g = code_graph
    other = other_version_record("features_graph", {"adjacency": g.adjacency, "features": g.features, "bias": g.bias})
    assert torch.equal(other["features"], g.features)
    assert torch.allclose(other["adjacency"], g.adjacency, atol=1e-5, rtol=0)
    assert torch.allclose(other["bias"], g.bias, atol=1e-5, rtol=0)


JSON_SCHEMA = {
    "type": "object", "required": ["metadata", "qParams", "nodes", "links"],
    "properties": {
        "metadata": {"type": "object", "required": ["slug", "scan", "transcoder_list", "prompt_tokens", "prompt"],
                     "properties": {"slug": {"type": "string"}, "scan": {"type": "string"},
                                    "transcoder_list": {"type": "array", "items": {"type": "string"}},
                                    "prompt_tokens": {"type": "array", "items": {"type": "string"}}, "prompt": {"type": "string"},
                                    "node_threshold": {"type": ["number", "null"]}, "schema_version": {"type": ["integer", "null"]}}},
        "qParams": {"type": "object", "required": ["pinnedIds", "supernodes", "linkType", "clickedId", "sg_pos"]},
        "nodes": {"type": "array", "items": {
            "type": "object", "required": ["node_id", "feature", "layer", "ctx_idx", "feature_type", "jsNodeId"],
            "properties": {"node_id": {"type": "string"}, "feature": {"type": "integer"}, "layer": {"type": "string"},
                           "ctx_idx": {"type": "integer"},
                           "feature_type": {"enum": ["cross layer transcoder", "mlp reconstruction error", "embedding", "logit"]},
                           "token_prob": {"type": "number"}, "is_target_logit": {"type": "boolean"}, "run_idx": {"type": "integer"},
                           "reverse_ctx_idx": {"type": "integer"}, "jsNodeId": {"type": "string"}, "clerp": {"type": "string"},
                           "influence": {"type": ["number", "null"]}, "activation": {"type": ["number", "null"]}}}},
        "links": {"type": "array", "items": {"type": "object", "required": ["source", "target", "weight"],
                                              "properties": {"source": {"type": "string"}, "target": {"type": "string"},
                                                             "weight": {"type": "number"}}}},
    },
}


def test_the_json_is_circuit_tracers(code_graph, tmp_path):
    import json

    jsonschema = pytest.importorskip("jsonschema")
    model, g = code_graph
    tok = ri.models.SHIPPED_MODELS["code-2l"].tokenizer()
    path = save_graph_json(g, tmp_path, slug="code", decode=lambda t: tok.decode([t]))
    data = json.loads(path.read_text())
    jsonschema.validate(data, JSON_SCHEMA)
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids)), "node ids are unique"
    assert {x for link in data["links"] for x in (link["source"], link["target"])} <= set(ids)
    pruned = g.prune()
    assert len(data["links"]) == pruned.n_edges
    assert sum(n["feature_type"] == "cross layer transcoder" for n in data["nodes"]) == pruned.counts()["feature"]
    assert len(data["metadata"]["prompt_tokens"]) == g.n_pos
    assert json.loads((tmp_path / "graph-metadata.json").read_text())["graphs"][0]["slug"] == "code"
    link = data["links"][0]
    s, t = ids.index(link["source"]), ids.index(link["target"])
    assert data["nodes"][t]["layer"] > data["nodes"][s]["layer"] or data["nodes"][s]["layer"] == "E"


def test_the_figure_draws_the_pruned_graph(code_graph):
    _, g = code_graph
    fig = graph_figure(g)
    pruned = g.prune()
    markers = sum(len(t.x) for t in fig.data if t.mode == "markers")
    assert markers == pruned.n_nodes
    segments = sum(len(t.x) // 3 for t in fig.data if t.mode == "lines")
    assert segments == pruned.n_edges
    html = fig.to_html(include_plotlyjs=True, full_html=True)
    assert "<script src=\"http" not in html and len(html) > 1_000_000, "plotly.js inlined: the file opens offline"


def test_refusals():
    model = make_variant("LN", "standard", False)
    tcs = random_transcoders(2, 16, 8)
    tokens = torch.arange(5)
    with pytest.raises(ValueError, match="attention-only"):
        attribution_graph(make_variant("LN", "standard", True), tcs, tokens)
    with pytest.raises(ValueError, match="one per layer"):
        attribution_graph(model, random_transcoders(1, 16, 8), tokens)
    with pytest.raises(ValueError, match="d_model"):
        attribution_graph(model, random_transcoders(2, 8, 8), tokens)
    with pytest.raises(ValueError, match="tokens"):
        attribution_graph(model, tcs, torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="targets"):
        attribution_graph(model, tcs, tokens, targets=[3, 3])
    with pytest.raises(ValueError, match="position"):
        attribution_graph(model, tcs, tokens, position=5)
    # a caller's hook that makes the stream nonlinear in the nodes: the rows no longer sum to the values
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", lambda t, hook: torch.tanh(t))]):
        with pytest.raises(ValueError, match="identity .stream. fails.*Hooks are attached at blocks.0.hook_resid_post"):
            attribution_graph(model, tcs, tokens)
    g = attribution_graph(model, tcs, tokens, targets=[1])
    with pytest.raises(ValueError, match="scale"):
        intervene(model, tcs, g, [0])
    with pytest.raises(ValueError, match="token node"):
        intervene(model, tcs, g, [g.token_node(0)], value=1.0)
    with pytest.raises(ValueError, match="not a feature, error or token"):
        intervene(model, tcs, g, [g.n_nodes - 1], scale=2.0)


def test_mlp_neurons_on_a_model_of_another_shape():
    """The ground truth on a deeper model with rotary positions: three layers, zero error, scores 1."""
    model = relu_model("RMS", "rotary", seed=9, n_layers=3)
    g = attribution_graph(model, mlp_transcoders(model), torch.arange(1, 11), targets=[5, 6])
    s = g.scores()
    assert abs(s.replacement - 1) < TOL and abs(s.completeness - 1) < TOL and g.n_layers == 3


def test_inference_mode_is_no_obstacle(code_graph):
    """The backward passes need autograd: a caller in inference mode gets the same graph."""
    model, g = code_graph
    with torch.inference_mode():
        again = attribution_graph(model, shipped_transcoders("code-2l"), g.tokens)
    assert torch.equal(again.adjacency, g.adjacency)


def test_options_are_one_checked_value():
    """attribution_graph's options are one frozen value, refused when made (issue 65)."""
    import dataclasses

    from rs_interp.features.attribution import GraphOptions

    assert GraphOptions().batch_size == 64 and GraphOptions(max_feature_nodes=0).max_feature_nodes == 0
    for bad in ({"batch_size": 0}, {"max_feature_nodes": -1}):
        with pytest.raises(ValueError, match="batch_size must be >= 1 and max_feature_nodes >= 0"):
            GraphOptions(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        GraphOptions().batch_size = 2


def test_the_model_is_left_as_it_was_found():
    """Modes, parameter gradients and grad mode are restored after the graph (and after a refusal): the
    replacement model's state is the context's, not the caller's."""
    model = relu_model("LN", seed=2)
    tcs = random_transcoders(2, 16, 8)
    model.train()
    model.blocks[0].eval()  # a submodule in another mode than its parent's, kept so
    list(model.parameters())[3].requires_grad_(False)  # one parameter a caller froze, left frozen
    state = lambda: ([p.requires_grad for p in model.parameters()], [m.training for m in model.modules()])  # noqa: E731
    before = state()
    with torch.no_grad():
        attribution_graph(model, tcs, torch.arange(1, 7), targets=[3], progress=False)
        with pytest.raises(ValueError, match="targets"):
            attribution_graph(model, tcs, torch.arange(1, 7), targets=[3, 3], progress=False)
        assert not torch.is_grad_enabled()
    assert state() == before


def test_half_models_are_computed_in_float32(code_graph):
    """A float16 model's graph is its float32 copy's (as elsewhere in rs_interp), and still sums exactly."""
    model, g = code_graph
    half = ri.as_dtype(model, torch.float16)
    g16 = attribution_graph(half, shipped_transcoders("code-2l"), g.tokens)
    assert g16.adjacency.dtype == torch.float32
    rows = _rows(g16)
    assert torch.allclose(g16.adjacency[rows].sum(1) + g16.bias[rows], g16.values[rows], atol=1e-3, rtol=0)
    assert half.cfg.dtype == torch.float16, "the caller's model is left as it was"
