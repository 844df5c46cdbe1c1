"""Issue 29: grouped-query attention and parallel blocks, in every helper.

The brute force for grouped-query attention (GQA) is an equivalence written apart from the library:
a GQA model computes the same function as the multi-head model whose key and value weights are the
GQA model's repeated over each group's query heads (built here from the portable state dict). So
every per-head helper must give the same numbers on both; a shared key (value) input feeds every
query head of its group, so its edge estimate is the sum of the multi-head model's edges into those
heads; and a group's input can be replaced only whole.
"""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.models.checkpoints import build_model
from tests.builders import TL4, perturb, tl3_only

N_HEADS, N_KV = 4, 2
SIZE = N_HEADS // N_KV  # query heads per KV head


def _build(seed=0, **fields):
    cfg = _backend.make_config(**dict(dict(n_layers=3, d_model=16, n_heads=N_HEADS, d_head=4, d_vocab=40, n_ctx=10,
                                           attn_only=False, d_mlp=32, act_fn="gelu", normalization_type="LN",
                                           positional_embedding_type="standard", dtype=torch.float64, seed=None,
                                           device="cpu"), **fields))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg)
    return perturb(model, seed).eval()


def _expanded_twin(gqa):
    """The multi-head model with the GQA model's key/value weights repeated per query head (written
    here from the portable names ``_W_K`` ... ``_b_V``, apart from the library's ``attn_weight``)."""
    fields = {**_backend.config_of(gqa), "n_key_value_heads": None}
    mha = build_model(_backend.make_config(**{**fields, "seed": None, "device": "cpu"}))
    state = {}
    for name, t in _backend.portable_state(gqa).items():
        if ".attn._" in name:  # blocks.L.attn._W_K: (kv_head, ...) -> (head, ...)
            name, t = name.replace("._", "."), t.repeat_interleave(SIZE, dim=0)
        state[name] = t
    _backend.load_portable_state(mha, state)
    return mha.eval()


POSITIONS = ["standard", "rotary"]


@pytest.fixture(scope="module", params=POSITIONS)
def pair(request):
    pos = request.param
    gqa = _build(n_key_value_heads=N_KV, positional_embedding_type=pos, rotary_dim=4 if pos == "rotary" else None)
    return gqa, _expanded_twin(gqa)


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 40, (2, 8), generator=g), torch.randint(0, 40, (2, 8), generator=g)


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def test_the_twin_computes_the_same_function(pair, tokens):
    gqa, mha = pair
    assert gqa.cfg.n_key_value_heads == N_KV and not getattr(mha.cfg, "n_key_value_heads", None)
    with torch.no_grad():
        assert (gqa(tokens[0]) - mha(tokens[0])).abs().max() <= 1e-12


def test_portable_names_are_hookedtransformers(pair):
    """Both versions name a GQA model's per-KV-head weights as HookedTransformer does (``_W_K``), so
    a checkpoint crosses versions; ``attn_weight`` gives them per query head."""
    gqa, mha = pair
    keys = _backend.expected_keys(gqa)
    assert keys["blocks.0.attn._W_K"] == (N_KV, 16, 4) and keys["blocks.0.attn._b_V"] == (N_KV, 4)
    assert "blocks.0.attn.W_K" not in keys
    for name in ("W_K", "W_V", "b_K", "b_V", "W_Q", "W_O"):
        assert torch.equal(_backend.attn_weight(gqa, name, N_HEADS), getattr(mha, name)), name


def test_checkpoint_round_trip(pair, tokens, tmp_path):
    gqa, _ = pair
    back = ri.models.load_model(ri.models.save_model(gqa, tmp_path / "gqa"))
    assert back.cfg.n_key_value_heads == N_KV
    with torch.no_grad():
        assert torch.equal(back(tokens[0]), gqa(tokens[0]))
    assert torch.equal(ri.as_dtype(gqa, torch.float64)(tokens[0]), gqa(tokens[0]))


def test_weight_helpers_match_the_twin(pair):
    gqa, mha = pair
    assert (ri.copying_scores(gqa) - ri.copying_scores(mha)).abs().max() <= 1e-9
    for kind in "qkv":
        a, b = ri.composition_scores(gqa, kind).scores, ri.composition_scores(mha, kind).scores
        assert torch.equal(a.isnan(), b.isnan()) and (a - b).nan_to_num(0).abs().max() <= 1e-12, kind


def test_activation_helpers_match_the_twin(pair, tokens):
    gqa, mha = pair
    toks, ref = tokens
    targets = ri.next_token_targets(toks)
    for f in (lambda m: ri.direct_logit_attribution(m, toks, targets=targets).contributions,
              lambda m: ri.second_order_attribution(m, toks, targets=targets, positions=[-2]).contributions,
              lambda m: ri.head_ablation_scan(m, toks, metric, ablation="mean").effect,
              lambda m: ri.attribution_patching(m, toks, metric, reference=ref).effect,
              lambda m: ri.prev_token_scores(m, toks),
              lambda m: ri.key_score_sensitivity(m, toks).max_abs_change):
        a, b = f(gqa), f(mha)
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-9


def test_edges_into_a_shared_input_sum_the_twins_edges(pair, tokens):
    """The key (value) input of KV head g feeds query heads g*SIZE ... g*SIZE+SIZE-1: its edge is the
    sum of the twin's edges into those heads. Queries, MLPs and logits are per head as before."""
    gqa, mha = pair
    toks, ref = tokens
    a = ri.edge_attribution_patching(gqa, toks, metric, reference=ref)
    b = ri.edge_attribution_patching(mha, toks, metric, reference=ref)
    assert a.layout.senders == b.layout.senders
    kv = [r for r in a.layout.receivers if "KV" in r]
    assert len(kv) == 3 * N_KV * 2 and "L1KV0.k" in kv and "L1H0.k" not in a.layout.receivers
    for s in a.layout.senders:
        for r in a.layout.receivers:
            if "KV" in r:
                l, g, x = int(r[1]), int(r.split("KV")[1][0]), r[-1]
                twins = [f"L{l}H{h}.{x}" for h in range(g * SIZE, (g + 1) * SIZE)]
            else:
                twins = [r]
            want = sum(b.effect[b.layout.senders.index(s), b.layout.receivers.index(t)] for t in twins)
            got = a.effect[a.layout.senders.index(s), a.layout.receivers.index(r)]
            assert bool(got.isnan()) == bool(want.isnan()) and float((got - want).nan_to_num(0).abs()) <= 1e-9, (s, r)
    node = ri.attribution_patching(gqa, toks, metric, reference=ref).effect
    totals = dict(zip(a.layout.senders, a.sender_totals().tolist()))
    heads = torch.tensor([[totals[f"L{l}H{h}"] for h in range(N_HEADS)] for l in range(3)], dtype=torch.float64)
    assert (node - heads).abs().max() <= 1e-9


def test_a_shared_input_is_replaced_whole_or_refused(pair, tokens):
    gqa, mha = pair
    toks, _ = tokens
    group = [(2, 2), (2, 3)]  # KV head 1 of layer 2
    with torch.no_grad():
        a = ri.run_with_key_input(gqa, toks, layer=2, keep=[(0, 1)], heads=group)
        b = ri.run_with_key_input(mha, toks, layer=2, keep=[(0, 1)], heads=group)
        assert (a - b).abs().max() <= 1e-12
        q = ri.run_with_query_input(gqa, toks, layer=2, heads=[(2, 1)])  # queries stay per head
        assert (q - ri.run_with_query_input(mha, toks, layer=2, heads=[(2, 1)])).abs().max() <= 1e-12
    with pytest.raises(ValueError, match=r"grouped-query attention: layer 2's heads \(2, 2\), \(2, 3\) share one k input \(KV head 1\)"):
        ri.run_with_key_input(gqa, toks, layer=2, heads=[(2, 3)])


# --- parallel blocks (GPT-J, GPT-NeoX, Pythia): the MLP reads the block's input -------------------

needs_parallel = tl3_only("4.3's native builders refuse parallel_attn_mlp (its Hugging Face-booted parallel families: tests/integration/test_pretrained.py)")


@needs_parallel
def test_parallel_block_has_no_same_layer_head_to_mlp_edge(tokens):
    model = _build(parallel_attn_mlp=True)
    toks, ref = tokens
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    layout = eap.layout
    for l in range(3):
        for h in range(N_HEADS):
            assert not layout.exists[layout.senders.index(f"L{l}H{h}"), layout.receivers.index(f"MLP{l}")]
    assert layout.exists[layout.senders.index("L0H2"), layout.receivers.index("MLP1")]
    assert not layout.exists[layout.senders.index("MLP0"), layout.receivers.index("L0H1.q")]
    # the edge L0H2 -> MLP 1 by brute force: the MLP's input (hook_mlp_in) moved along the head's write
    with torch.no_grad():
        _, clean = model.run_with_cache(toks)
        _, refc = model.run_with_cache(ref)
    w = (refc["blocks.0.attn.hook_z"] - clean["blocks.0.attn.hook_z"])[:, :, 2] @ model.blocks[0].attn.W_O[2]
    model.cfg.use_hook_mlp_in = True
    try:
        def at(eps):
            with torch.no_grad():
                return float(metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_mlp_in", lambda t, hook: t + eps * w)])))
        want = (at(1e-4) - at(-1e-4)) / 2e-4
    finally:
        model.cfg.use_hook_mlp_in = False
    assert eap.edge("L0H2", "MLP1") == pytest.approx(want, abs=1e-6)
    # and a head's outgoing edges sum to its node estimate (no same-layer edge to double count)
    node = ri.attribution_patching(model, toks, metric, reference=ref).effect
    totals = dict(zip(layout.senders, eap.sender_totals().tolist()))
    heads = torch.tensor([[totals[f"L{l}H{h}"] for h in range(N_HEADS)] for l in range(3)], dtype=torch.float64)
    assert (node - heads).abs().max() <= 1e-9


@needs_parallel
def test_parallel_block_dla_and_ablation_are_exact(tokens):
    model = _build(parallel_attn_mlp=True)
    toks, _ = tokens
    targets = ri.next_token_targets(toks)
    dla = ri.direct_logit_attribution(model, toks, targets=targets)
    with torch.no_grad():
        logits = model(toks)
    centered = logits - logits.mean(-1, keepdim=True)  # the metric DLA splits: the target's centered logit
    want = centered.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    assert (dla.contributions.sum(0) - want)[targets >= 0].abs().max() <= 1e-9
    scan = ri.head_ablation_scan(model, toks, metric, ablation="zero")
    with torch.no_grad():
        def zero(t, hook):
            t = t.clone()
            t[:, :, 1] = 0
            return t
        brute = float(metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", zero)])))
    assert float(scan.ablated[1, 1]) == pytest.approx(brute, abs=1e-12)


# --- qk-norm: the score is not the bilinear form W_Q W_K^T -------------------------------------------


@tl3_only("4.3's native builders refuse use_qk_norm")
def test_qk_norm_weight_readings_of_the_score_are_refused():
    """The weight-based readings of the score refuse by name; V-composition (no score) and the
    activation-based helpers run (the latter checked against brute forces on the qk-norm grid
    variant in tests/readouts/test_attribution.py, tests/readouts/test_paths.py, tests/circuits/test_node_attribution.py,
    tests/circuits/test_path_patching.py and tests/circuits/test_evaluation.py)."""
    from tests.builders import make_variant

    model = make_variant("RMS", "rotary", False, "qk_norm", seed=3)
    for call in (lambda: ri.composition_scores(model, "k"), lambda: ri.composition_scores(model, "q"),
                 lambda: ri.virtual_weight(model, (0, 0), (1, 1), "q"), lambda: ri.positional_scores(model, 1)):
        with pytest.raises(ValueError, match="use_qk_norm"):
            call()
    assert ri.composition_scores(model, "v").scores.isfinite().any()


# --- an unembedding bias: built natively on 4.x (a buffer of the native head), a parameter on 3.x ----------------------

def test_a_nonzero_unembedding_bias_is_built_and_decomposed():
    """A model with a nonzero ``b_U`` (loaded from the portable state dict, as a checkpoint is) computes
    ``ln_final(x) W_U + b_U`` (by hand from the cached normalised final stream and the portable weights, 1e-12), every identity of the
    certificate holds, DLA's parts (``"b_U"``'s part ``b_U[t] - mean(b_U)``) sum to the centered logit, and the
    checkpoint round trip and ``as_dtype`` keep it. On 4.x it is the bias buffer TransformerLens's
    ``UnembeddingBridge`` gives the native head (not a parameter: rs_interp never trains ``b_U``)."""
    model = _build(seed=3)
    state = _backend.portable_state(model)
    b_U = torch.randn(state["unembed.b_U"].shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    _backend.load_portable_state(model, {**state, "unembed.b_U": b_U})
    toks = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks)
    assert torch.equal(model.b_U.detach(), b_U)
    final = cache["ln_final.hook_normalized"] * state["ln_final.w"] + state["ln_final.b"]
    assert (final @ state["unembed.W_U"] + b_U - logits).abs().max() <= 1e-12
    assert ri.certify(model).failed() == ()
    targets = ri.next_token_targets(toks)
    dla = ri.direct_logit_attribution(model, toks, targets=targets)
    want = (logits - logits.mean(-1, keepdim=True)).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    ok = targets >= 0
    assert (dla.contributions.sum(0) - want)[ok].abs().max() <= 1e-10
    part = dla.contributions[dla.labels.index("b_U")]
    assert (part - (b_U - b_U.mean())[targets.clamp(min=0)])[ok].abs().max() <= 1e-12
    with torch.no_grad():
        assert (ri.as_dtype(model, torch.float64)(toks) - logits).abs().max() <= 1e-12
    assert any(p is model.b_U for p in model.parameters()) == (not TL4)  # 4.x: a buffer


def test_an_unembedding_bias_survives_the_checkpoint_round_trip(tmp_path):
    model = _build(seed=5)
    state = _backend.portable_state(model)
    _backend.load_portable_state(model, {**state, "unembed.b_U": torch.linspace(-1, 1, state["unembed.b_U"].numel(),
                                                                                dtype=torch.float64)})
    toks = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(6))
    loaded = ri.models.load_model(ri.models.save_model(model, tmp_path / "m"))
    with torch.no_grad():
        assert torch.equal(loaded(toks), model(toks))
