"""Transcoders (issue 46): circuit-tracer's files, the activations, the exact transcoders of a ReLU MLP
(the ground truth of feature circuits, checked against tracr's known circuits), training and its
measures, each against a brute force written here from the formulas."""

from __future__ import annotations

import json

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.features import (
    Transcoder,
    TranscoderSet,
    attribution_graph,
    load_transcoders,
    mlp_transcoders,
    shipped_metrics,
    shipped_transcoders,
    train_transcoder,
    transcoder_metrics,
)
from tests.builders import NORMALIZATIONS, perturb

TRACR = ("tracr-sort", "tracr-reverse", "tracr-hist", "tracr-frac_prevs", "tracr-at_least_half")


def random_transcoders(n_layers, d_model, width, *, activation="relu", skip=False, seed=0, dtype=torch.float64, k=4):
    """Random transcoders with every tensor nonzero; pre-activations centred a little below 0 so some features are off."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_layers):
        tc = Transcoder(d_model, width, activation=activation, k=k if activation == "topk" else None, skip=skip, dtype=dtype)
        with torch.no_grad():
            for name, p in tc.named_parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * (0.3 if name != "threshold" else 0.2))
            tc.b_enc.sub_(0.3)
            if tc.threshold is not None:
                tc.threshold.abs_()
        out.append(tc.requires_grad_(False))
    return TranscoderSet(tuple(out), scan="random")


def relu_model(norm="LN", pos="standard", *, seed=0, n_layers=2, d_model=16, d_vocab=50, n_ctx=12):
    """A small random model with ReLU MLPs and every bias and gain nonzero (both TransformerLens versions)."""
    cfg = _backend.make_config(n_layers=n_layers, d_model=d_model, n_heads=2, d_head=8, d_mlp=4 * d_model, d_vocab=d_vocab,
                               n_ctx=n_ctx, act_fn="relu", normalization_type=norm, positional_embedding_type=pos,
                               rotary_dim=8 if pos == "rotary" else None, dtype=torch.float64, seed=None, device="cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _backend.build_model(cfg)
    return perturb(model, seed).eval()


def tracr_tokens(name, n=3, seed=0):
    """``n`` random valid inputs of the compiled model ``name``: BOS, then values of its vocabulary."""
    meta = ri.models.SHIPPED_MODELS[name].metadata()["tracr"]
    ids = meta["token_ids"]
    values = [ids.index(v) for v in meta["vocab"]]
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(2, meta["max_seq_len"] + 1, (1,), generator=g))
        rows.append(torch.tensor([ids.index(meta["bos"])] + [values[int(i)] for i in torch.randint(0, len(values), (length,), generator=g)]))
    return rows


# --- the transcoder and its files ------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_activations_follow_their_formulas(activation):
    tc = random_transcoders(1, 6, 10, activation=activation, seed=1)[0]
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    pre = x @ tc.W_enc.T + tc.b_enc
    if activation == "relu":
        expected = pre.clamp(min=0)
    elif activation == "jumprelu":
        expected = torch.where(pre > tc.threshold, pre, torch.zeros_like(pre))
    else:
        expected = torch.zeros_like(pre)
        for i in range(5):
            kept = sorted(range(10), key=lambda j: -float(pre[i, j]))[:4]
            expected[i, kept] = pre[i, kept]
    assert torch.equal(tc.encode(x), expected)
    assert torch.allclose(tc(x), expected @ tc.W_dec + tc.b_dec, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
@pytest.mark.parametrize("skip", [False, True])
def test_files_round_trip_in_circuit_tracers_format(tmp_path, activation, skip):
    import yaml
    from safetensors.torch import load_file

    tcs = random_transcoders(2, 6, 10, activation=activation, skip=skip, dtype=torch.float32)
    tcs.save(tmp_path)
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert cfg["model_kind"] == "transcoder_set" and cfg["activation"] == activation
    assert (cfg["feature_input_hook"], cfg["feature_output_hook"]) == ("mlp.hook_in", "mlp.hook_out")
    keys = set(load_file(str(tmp_path / "layer_1.safetensors")))
    expected = {"W_enc", "W_dec", "b_enc", "b_dec"} | ({"W_skip"} if skip else set())
    expected |= {"activation_function.threshold"} if activation == "jumprelu" else set()
    assert keys == expected  # TopK's k in config.yaml only: circuit-tracer's load_transcoder refuses a "k" tensor
    assert cfg.get("k") == (4 if activation == "topk" else None)
    back = load_transcoders(tmp_path)
    x = torch.randn(4, 6)
    for a, b in zip(tcs, back):
        assert b.activation == activation and (b.W_skip is not None) == skip
        assert torch.equal(a(x), b(x))


def test_reads_a_set_written_by_hand(tmp_path):
    """A config that lists its files (as circuit-tracer's do) and infers JumpReLU from the threshold."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    for i in range(2):
        save_file({"W_enc": torch.randn(8, 4, generator=g), "W_dec": torch.randn(8, 4, generator=g), "b_enc": torch.zeros(8),
                   "b_dec": torch.zeros(4), "activation_function.threshold": torch.full((8,), 0.5)}, str(tmp_path / f"t{i}.safetensors"))
    (tmp_path / "config.yaml").write_text("model_kind: transcoder_set\nfeature_input_hook: hook_resid_mid\n"
                                          "feature_output_hook: hook_mlp_out\nscan: hand\ntranscoders:\n- t0.safetensors\n- t1.safetensors\n")
    tcs = load_transcoders(tmp_path)
    assert len(tcs) == 2 and tcs.input_point == "hook_resid_mid" and tcs.scan == "hand"
    assert tcs[0].activation == "jumprelu" and float(tcs[0].threshold.detach()[0]) == 0.5


@pytest.mark.parametrize("config, why", [
    ("model_kind: cross_layer_transcoder\n", "cross-layer"),
    ("model_kind: transcoder_set\ntranscoders:\n- hf://a/b/layer_0.safetensors\n", "hf://"),
    ("model_kind: transcoder_set\ntranscoders:\n- missing.safetensors\n", "missing"),
    ("model_kind: transcoder_set\nfeature_input_hook: blocks.resid\n", "input_point"),
])
def test_bad_sets_are_refused(tmp_path, config, why):
    if why == "input_point":
        random_transcoders(1, 4, 4, dtype=torch.float32).save(tmp_path)
    (tmp_path / "config.yaml").write_text(config)
    with pytest.raises(ValueError, match=why):
        load_transcoders(tmp_path)


def test_bad_transcoders_are_refused():
    with pytest.raises(ValueError, match="k in"):
        Transcoder(4, 8, activation="topk")
    with pytest.raises(ValueError, match="activation"):
        Transcoder(4, 8, activation="gelu")
    with pytest.raises(ValueError, match="one activation"):
        TranscoderSet((Transcoder(4, 8), Transcoder(4, 8, activation="topk", k=2))).config()


@pytest.mark.parametrize("config", [
    {"model_kind": "transcoder_set", "scan": "mntss/x@main", "feature_input_hook": "mlp.hook_in", "activation": "topk", "k": 64},
    {"model_name": "google/gemma-2-2b", "model_kind": "transcoder_set", "transcoders": ["hf://a/b/layer_0.npz", "layer 1.safetensors"],
     "threshold": 0.5, "flag": True, "none": None, "quote": "it's: # here", "number_like": "007"},
])
def test_the_config_reader_agrees_with_pyyaml(config):
    """rs_interp reads and writes circuit-tracer's flat config.yaml without PyYAML; PyYAML is the referee."""
    import yaml

    from rs_interp.features import _config

    assert _config.loads(yaml.safe_dump(config, sort_keys=False)) == config
    with pytest.raises(ValueError, match="key: value"):  # a whole flow-style document is outside the subset: refused
        _config.loads(yaml.safe_dump(config, default_flow_style=True))
    assert yaml.safe_load(_config.dumps(config)) == config
    assert _config.loads(_config.dumps(config)) == config


@pytest.mark.parametrize("text, why", [("a:\n  b: 1\n", "nested"), ("- x\n", "outside a list"), ("a: {b: 1}\n", "scalar"),
                                       ("a: 1\na: 2\n", "twice"), ("just text\n", "key: value")])
def test_the_config_reader_refuses_what_it_does_not_know(text, why):
    from rs_interp.features import _config

    with pytest.raises(ValueError, match=why):
        _config.loads(text)


# --- the ground truth: a ReLU MLP's own neurons -------------------------------------------------------


@pytest.mark.parametrize("norm", NORMALIZATIONS)
def test_a_relu_mlps_neurons_reconstruct_it_exactly(norm):
    """Error 0, replacement = completeness = 1, FVU 0 and KL 0, on random ReLU models of every norm."""
    model = relu_model(norm, seed=3)
    tcs = mlp_transcoders(model)
    tokens = torch.randint(0, 50, (10,), generator=torch.Generator().manual_seed(4))
    g = attribution_graph(model, tcs, tokens)
    assert float(g.errors.abs().max()) < 1e-12
    assert float(g.adjacency[:, g.n_features : g.n_features + g.n_layers * g.n_pos].abs().max()) < 1e-12
    s = g.scores()
    assert abs(s.replacement - 1) < 1e-9 and abs(s.completeness - 1) < 1e-9
    m = transcoder_metrics(model, tcs, tokens[None])
    assert max(m.fvu) < 1e-10 and abs(m.kl) < 1e-10
    # a transcoder that is not the MLP (a neuron dropped) has error, and scores below 1
    broken = mlp_transcoders(model)
    with torch.no_grad():
        broken[0].W_dec[int(g.features[0, 2])] *= 0.5
    s2 = attribution_graph(model, broken, tokens).scores()
    assert s2.replacement < 1 - 1e-6 or s2.completeness < 1 - 1e-6


@pytest.mark.parametrize("name", TRACR)
def test_tracr_feature_graphs_follow_their_known_circuits(name):
    """The neurons of tracr's MLPs reconstruct them exactly, and every direct effect between feature,
    token and logit nodes runs along the known circuit: sender -> receiver, directly or through heads'
    values (a chain of known ``s -> LxHy.v``, ``LxHy -> r`` edges)."""
    model = ri.as_dtype(ri.load_toy_model(name), torch.float64)
    meta = ri.models.SHIPPED_MODELS[name].metadata()["tracr"]
    edges = {tuple(e) for e in meta["edges"]}
    heads = {s for s, _ in edges if s.startswith("L")} | {r[:-2] for _, r in edges if r.endswith(".v")}

    def reaches(sender: str, receiver: str, seen=frozenset()) -> bool:
        if (sender, receiver) in edges:
            return True
        return any((sender, h + ".v") in edges and h not in seen and reaches(h, receiver, seen | {h}) for h in heads)

    tcs = mlp_transcoders(model)
    numerical = meta["output"] == "numerical"
    for tokens in tracr_tokens(name):
        g = attribution_graph(model, tcs, tokens, position=-1, centered=not numerical)
        assert float(g.errors.abs().max()) < 1e-12
        s = g.scores()
        assert abs(s.replacement - 1) < 1e-9 and abs(s.completeness - 1) < 1e-9
        kinds = g.kinds()
        node_name = lambda n: ("embed" if kinds[n] == "token" else "logits" if kinds[n] == "logit"  # noqa: E731
                               else f"MLP{int(g.features[n, 0])}")
        strong = (g.adjacency.abs() > 1e-9).nonzero().tolist()
        bad = [(node_name(s), node_name(t)) for t, s in strong if kinds[s] != "error" and not reaches(node_name(s), node_name(t))]
        assert bad == [], f"{name}: direct effects off the known circuit: {sorted(set(bad))}"
        assert strong, "the graph has edges"


def test_mlp_transcoders_refuse_what_is_not_a_relu_mlp():
    with pytest.raises(ValueError, match="gelu"):
        mlp_transcoders(ri.load_toy_model("code-2l"))
    with pytest.raises(ValueError, match="attention-only"):
        mlp_transcoders(ri.load_toy_model("induction-1l"))


# --- training and its measures ---------------------------------------------------------------------


@torch.no_grad()
def _brute_metrics(model, tcs, tokens):
    """FVU, L0, dead and KL written from the formulas: MLP inputs by hand from hook_resid_mid and the
    run's ln2 scale, the replacement run with each hook_mlp_out replaced by its transcoder's output."""
    _, cache = model.run_with_cache(tokens)
    fvu, l0, dead = [], [], []
    for l, tc in enumerate(tcs):
        x = _mlp_input(model, l, cache[f"blocks.{l}.hook_resid_mid"], cache.cache_dict.get(f"blocks.{l}.ln2.hook_scale"))
        y = cache[f"blocks.{l}.hook_mlp_out"]
        acts = tc.encode(x.float())
        fvu.append(float(((tc.decode(acts, x.float()) - y) ** 2).sum() / ((y - y.reshape(-1, y.shape[-1]).mean(0)) ** 2).sum()))
        l0.append(float((acts != 0).float().sum(-1).mean()))
        dead.append(float(((acts != 0).reshape(-1, acts.shape[-1]).sum(0) == 0).float().mean()))
    store = {}
    hooks = []
    for l in range(model.cfg.n_layers):
        hooks.append((f"blocks.{l}.hook_resid_mid", lambda t, hook, l=l: store.__setitem__(("r", l), t)))
        if model.cfg.normalization_type:
            hooks.append((f"blocks.{l}.ln2.hook_scale", lambda t, hook, l=l: store.__setitem__(("s", l), t)))
        hooks.append((f"blocks.{l}.hook_mlp_out",
                      lambda t, hook, l=l: tcs[l](_mlp_input(model, l, store[("r", l)], store.get(("s", l))).float()).to(t.dtype)))
    with torch.no_grad():
        p = model(tokens).double().log_softmax(-1)
        with model.hooks(fwd_hooks=hooks):
            q = model(tokens).double().log_softmax(-1)
    return fvu, l0, dead, float((p.exp() * (p - q)).sum(-1).mean())


def _mlp_input(model, layer, resid, scale):
    """The MLP's input from the stream before ``ln2``, with the norm written out from the config."""
    kind, ln = model.cfg.normalization_type, model.blocks[layer].ln2
    x = resid
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    if kind is not None:
        x = x / scale
    if kind in ("LN", "RMS"):
        x = x * ln.w
    return x + ln.b if kind == "LN" else x


@pytest.mark.parametrize("activation", ["relu", "topk"])
def test_training_lowers_the_error_and_its_measures_are_right(activation):
    model = relu_model("LN", seed=5, d_vocab=40, n_ctx=12)
    g = torch.Generator().manual_seed(6)
    tokens, held = torch.randint(0, 40, (64, 12), generator=g), torch.randint(0, 40, (16, 12), generator=g)
    t = train_transcoder(model, tokens, d_transcoder=48, activation=activation, k=6, l1=1e-3, steps=150, batch_size=256,
                         lr=3e-3, eval_tokens=held)
    assert all(c[-1] < 0.6 * c[0] for c in t.curves), t.curves
    m = t.metrics
    fvu, l0, dead, kl = _brute_metrics(model, t.transcoders, held)
    assert m.fvu == pytest.approx(fvu, rel=1e-4) and m.l0 == pytest.approx(l0) and m.dead == pytest.approx(dead)
    assert m.kl == pytest.approx(kl, rel=1e-4, abs=1e-7) and m.kl > 0
    if activation == "topk":
        assert m.l0 == (6.0, 6.0)
    again = train_transcoder(model, tokens, d_transcoder=48, activation=activation, k=6, l1=1e-3, steps=150, batch_size=256,
                             lr=3e-3, eval_tokens=held)
    assert all(torch.equal(a.W_dec, b.W_dec) for a, b in zip(t.transcoders, again.transcoders)), "same seed, same transcoders"


def test_training_refuses_jumprelu():
    with pytest.raises(ValueError, match="JumpReLU"):
        train_transcoder(relu_model(), torch.zeros(2, 4, dtype=torch.long), d_transcoder=8, activation="jumprelu")


def test_training_in_inference_mode_is_the_same():
    """Training needs autograd: a caller in inference mode gets the same transcoders (its tokens copied out)."""
    model, tokens = relu_model(seed=3), torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(1))
    t = train_transcoder(model, tokens, d_transcoder=8, steps=3, batch_size=16, progress=False)
    with torch.inference_mode():
        inside = train_transcoder(model, tokens.clone(), d_transcoder=8, steps=3, batch_size=16, progress=False)
    assert all(torch.equal(a.W_dec, b.W_dec) for a, b in zip(t.transcoders, inside.transcoders))
    assert t.metrics == inside.metrics


# --- the shipped set -------------------------------------------------------------------------------


def test_the_shipped_set_loads_and_keeps_its_recorded_quality():
    """The shipped code-2l set: circuit-tracer's files, its recorded metrics within their own bounds,
    and on fresh repeated sequences (a distribution it was trained on) a replacement that explains
    most of each MLP's variance with few features."""
    tcs = shipped_transcoders("code-2l")
    metrics = shipped_metrics("code-2l")
    m = metrics["metrics"]
    assert len(tcs) == 2 and tcs[0].d_model == 128 and all(tc.d_transcoder == metrics["settings"]["d_transcoder"] for tc in tcs)
    assert all(0 < v < 0.5 for v in m["fvu"]) and all(0 < v <= 64 for v in m["l0"]) and m["kl"] > 0
    model = ri.load_toy_model("code-2l")
    tokens = ri.induction_batch(8, seed=11, d_vocab=2048, seq_len=64).tokens
    fresh = transcoder_metrics(model, tcs, tokens)
    assert max(fresh.fvu) < 0.5 and max(fresh.l0) <= 64
    assert json.loads(json.dumps(metrics)) == metrics
