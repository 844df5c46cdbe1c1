import pytest
import torch

import rs_interp as ri
from conftest import TL4
from rs_interp.reproduce.expected import EXPECTED

# TransformerLens 4's native models have no unembedding bias: its path is there on 3.x only.
HAS_B_U = not TL4


def test_nine_paths_sum_to_the_logits(toy2_f64, test_set):
    pe = ri.path_expansion(toy2_f64, test_set.tokens[:200])
    assert len(pe.labels) == 9 and pe.labels[0] == "direct"
    assert pe.contributions.shape == (9, 200, 48, 256)
    err = (pe.total() - toy2_f64(test_set.tokens[:200])).abs().max()
    assert err <= 1e-10  # theory: 2e-14


def test_direct_path_is_the_bigram_term(toy2_f64, small_batch):
    pe = ri.path_expansion(toy2_f64, small_batch.tokens)
    assert torch.allclose(pe.contributions[0], toy2_f64.W_E[small_batch.tokens] @ toy2_f64.W_U, atol=1e-12)


def test_targets_select_without_full_vocab(toy2_f64, small_batch):
    full = ri.path_expansion(toy2_f64, small_batch.tokens)
    t = torch.randint(0, 256, small_batch.tokens.shape, generator=torch.Generator().manual_seed(0))
    sel = ri.path_expansion(toy2_f64, small_batch.tokens, targets=t)
    assert sel.contributions.shape == (9, 32, 48)
    assert torch.allclose(sel.contributions, full.contributions.gather(-1, t[None, ..., None].expand(9, -1, -1, 1))[..., 0], atol=1e-12)


def test_random_three_by_three_with_biases(random3x3, small_batch):
    pe = ri.path_expansion(random3x3, small_batch.tokens)
    head_paths = [l for l in pe.labels if not l.startswith(("bias", "b_U"))]
    assert len(head_paths) == (1 + 3) ** 3  # 64 paths
    assert ("b_U" in pe.labels) == HAS_B_U and any(l.startswith("bias L0>") for l in pe.labels)
    assert (pe.total() - random3x3(small_batch.tokens)).abs().max() <= 1e-10


@pytest.mark.parametrize("shape", [dict(n_layers=1), dict(n_layers=3, n_heads=1, d_head=32), dict(n_layers=2, positional_embedding_type="standard")])
def test_other_shapes(shape, small_batch):
    model = ri.make_attn_only(seed=4, dtype=torch.float64, **shape)
    pe = ri.path_expansion(model, small_batch.tokens)
    assert len(pe.labels) == (1 + model.cfg.n_heads) ** model.cfg.n_layers
    assert (pe.total() - model(small_batch.tokens)).abs().max() <= 1e-10


def test_layer1_paths_carry_the_answer(toy2, test_set):
    att = ri.path_logit_attribution(toy2, test_set.tokens, targets=test_set.targets)
    assert EXPECTED["paths.layer1_share"].holds(float(att.share_ending_in(1).median()))
    assert EXPECTED["paths.top1_without_last"].holds(att.top1_without_last_layer)
    assert torch.allclose(att.share.sum(0), torch.ones(att.share.shape[1]), atol=1e-4)


def test_refuses_layernorm_models(small_batch):
    model = ri.make_attn_only(2, normalization_type="LN")
    with pytest.raises(ValueError, match="direct_logit_attribution"):
        ri.path_expansion(model, small_batch.tokens)


def test_dla_sums_to_the_metric_on_a_gpt2_shaped_model(gpt2_tiny):
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    tg = ri.next_token_targets(toks)
    dla = ri.direct_logit_attribution(gpt2_tiny, toks, targets=tg)
    n_heads = gpt2_tiny.cfg.n_layers * gpt2_tiny.cfg.n_heads
    assert sum(l.startswith("L") for l in dla.labels) == n_heads
    assert (dla.total() - dla.per_position).abs().max() <= 1e-4
    other = toks
    diff = ri.direct_logit_attribution(gpt2_tiny, toks, targets=tg, contrast=other)
    assert (diff.total() - diff.per_position).abs().max() <= 1e-4


# ---- issue 12: exact on every variant TransformerLens builds -----------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import POSITIONS, VARIANTS, architecture_params, make_variant, variant_id  # noqa: E402


def _brute_force_dla(model, tokens, targets):
    """Independent of the helper: each head's result ``z W_O`` (TransformerLens's ``hook_result``), and each
    component's part as (d metric / d final stream) . component by autograd, with the final norm's
    scale detached (frozen). The constant rest (LN bias, b_U) is metric - grad . stream."""
    cache, stream = {}, {}
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def keep(t, hook):
        cache[hook.name] = t.detach()

    def leaf(t, hook):
        stream["x"] = t.detach().requires_grad_(True)
        return stream["x"]

    fwd = [(lambda n: n.endswith(("hook_embed", "hook_pos_embed", "hook_z", "hook_mlp_out")), keep), (name, leaf)]
    if model.cfg.normalization_type is not None:
        fwd.append(("ln_final.hook_scale", lambda t, hook: t.detach()))
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd)
        metric = logits.gather(-1, targets[..., None])[..., 0] - logits.mean(-1)
        (grad,) = torch.autograd.grad(metric.sum(), stream["x"])
    part = lambda c: (grad * c).sum(-1)  # noqa: E731
    out = {"W_E": part(cache["hook_embed"])}
    if model.cfg.positional_embedding_type == "standard":
        out["W_pos"] = part(cache["hook_pos_embed"])
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            out[f"L{l}H{h}"] = part(cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ model.blocks[l].attn.W_O[h].detach())
        out[f"b_O L{l}"] = part(model.blocks[l].attn.b_O.detach().expand_as(cache["hook_embed"]))
        if not model.cfg.attn_only:
            out[f"MLP{l}"] = part(cache[f"blocks.{l}.hook_mlp_out"])
    out["constant"] = metric.detach() - part(stream["x"].detach())
    return out, metric.detach()


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_dla_is_exact_on_every_variant(variant):
    """Each component equals the autograd brute force (1e-9), and the sum equals the metric (1e-6), float64."""
    model = make_variant(*variant, seed=1)
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=g)
    tg = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=g)
    dla = ri.direct_logit_attribution(model, toks, targets=tg)
    brute, metric = _brute_force_dla(model, toks, tg)
    assert (dla.per_position - metric).abs().max() <= 1e-10
    assert (dla.total() - metric).abs().max() <= 1e-6
    got = dict(zip(dla.labels, dla.contributions))
    constant = sum(got.pop(k) for k in ("ln_final.b", "b_U") if k in got)
    assert set(got) == set(brute) - {"constant"}  # pos_embed only where it enters the stream
    for k, v in got.items():
        assert (v - brute[k]).abs().max() <= 1e-9, k
    assert (constant - brute["constant"]).abs().max() <= 1e-9


@settings(max_examples=25, deadline=None)
@given(variant=st.sampled_from(VARIANTS), seed=st.integers(0, 1000), n_layers=st.integers(1, 3), n_heads=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float64]), contrast=st.booleans())
def test_dla_sums_to_the_metric_property(variant, seed, n_layers, n_heads, dtype, contrast):
    model = make_variant(*variant, seed=seed, n_layers=n_layers, n_heads=n_heads, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=g)
    tg = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=g)
    dla = ri.direct_logit_attribution(model, toks, targets=tg, contrast=toks if contrast else None)
    tol = 1e-6 if dtype == torch.float64 else 1e-4
    assert (dla.total() - dla.per_position).abs().max() <= tol


@pytest.mark.parametrize("pos", POSITIONS)
def test_path_expansion_is_exact_for_every_positional_scheme(pos):
    """Attention-only, no norm, every bias nonzero: the paths (b_U included) sum to the logits."""
    model = make_variant(None, pos, True, seed=3, n_layers=3)
    toks = torch.randint(0, model.cfg.d_vocab, (3, 11), generator=torch.Generator().manual_seed(4))
    pe = ri.path_expansion(model, toks)
    assert ("b_U" in pe.labels) == HAS_B_U and "bias L0" in pe.labels
    assert (pe.total() - model(toks)).abs().max() <= 1e-10


def test_bias_terms_belong_to_the_layer_that_writes_them(random3x3, small_batch):
    pe = ri.path_expansion(random3x3, small_batch.tokens[:2])
    layer = dict(zip(pe.labels, pe.last_layer().tolist()))
    assert layer["bias L0"] == 0 and layer["bias L2"] == 2 and layer["bias L0>L1H2"] == 1
    assert layer["direct"] == -1 and layer.get("b_U", -1) == -1 and layer["L0H1>L2H0"] == 2


def test_path_attribution_counts_b_U(small_batch):
    """The centered logit of the correct token, b_U's part included, is the sum of the parts."""
    model = make_variant(None, "rotary", True, seed=5, n_layers=2, d_vocab=256, n_ctx=48)
    att = ri.path_logit_attribution(model, small_batch.tokens, targets=small_batch.targets)
    assert (att.labels[-1] == "b_U") == HAS_B_U
    toks = small_batch.tokens
    logits = model(toks)[:, :-1][small_batch.scored]
    correct = toks[:, 1:][small_batch.scored]
    centered = logits.gather(-1, correct[:, None])[:, 0] - logits.mean(-1)
    assert (att.centered.sum(0) - centered).abs().max() <= 1e-10


@pytest.mark.parametrize("helper", ["path_expansion", "direct_logit_attribution", "path_logit_attribution"])
def test_a_hook_that_changes_the_run_is_named_not_silently_decomposed(helper, small_batch):
    model = make_variant(None, "rotary", True, seed=6, n_layers=2, d_vocab=256, n_ctx=48)
    toks = small_batch.tokens[:4]
    call = {"path_expansion": lambda: ri.path_expansion(model, toks),
            "direct_logit_attribution": lambda: ri.direct_logit_attribution(model, toks, targets=toks),
            "path_logit_attribution": lambda: ri.path_logit_attribution(model, toks, targets=small_batch.targets[:4])}[helper]
    model.add_hook("blocks.0.hook_resid_post", lambda t, hook: t * 1.5)
    try:
        with pytest.raises(ValueError, match=r"blocks\.0\.hook_resid_post"):
            call()
    finally:
        model.reset_hooks()
    model.add_hook("blocks.0.hook_resid_post", lambda t, hook: None)  # a passive hook: decomposed as usual
    try:
        call()
    finally:
        model.reset_hooks()


def test_a_hook_on_z_is_decomposed_with_it():
    """DLA reads z after the user's hook on it: the split is that of the hooked run, and it sums to it."""
    model = make_variant("LN", "standard", False, seed=7)
    toks = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    model.add_hook("blocks.0.attn.hook_z", lambda t, hook: t * 2.0)
    try:
        dla = ri.direct_logit_attribution(model, toks, targets=toks)
        hooked = model(toks)
    finally:
        model.reset_hooks()
    metric = hooked.gather(-1, toks[..., None])[..., 0] - hooked.mean(-1)
    assert (dla.total() - metric).abs().max() <= 1e-8


# ---- targets=-1 skips a position, in every helper that takes targets ------------------------------------------------

def _skipping_targets(model, toks, seed=7):
    """Random targets with about a third of the positions skipped (-1), and the skip mask."""
    g = torch.Generator().manual_seed(seed)
    tg = torch.randint(0, model.cfg.d_vocab, toks.shape, generator=g)
    skip = torch.rand(toks.shape, generator=g) < 0.35
    skip[0, 0], skip[0, 1] = True, False
    return tg.masked_fill(skip, -1), skip


@pytest.mark.parametrize("variant", [(None, "rotary", True), ("LN", "standard", False)], ids=variant_id)
def test_dla_skips_minus_one(variant):
    """At a skipped position every part and the metric are 0; elsewhere the parts are the brute force's (1e-9)."""
    model = make_variant(*variant, seed=1)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=torch.Generator().manual_seed(2))
    tg, skip = _skipping_targets(model, toks)
    dla = ri.direct_logit_attribution(model, toks, targets=tg)
    assert bool((dla.contributions[:, skip] == 0).all()) and bool((dla.per_position[skip] == 0).all())
    brute, metric = _brute_force_dla(model, toks, tg.clamp(min=0))
    assert (dla.per_position[~skip] - metric[~skip]).abs().max() <= 1e-10
    for k, v in zip(dla.labels, dla.contributions):
        if k in brute:
            assert (v[~skip] - brute[k][~skip]).abs().max() <= 1e-9, k


def test_path_helpers_skip_minus_one(random3x3, small_batch):
    """path_expansion: 0 at skipped positions, elsewhere the full-vocabulary expansion read at the target;
    path_logit_attribution: one column per kept position, summing to the centered logit there (1e-10)."""
    toks = small_batch.tokens[:3, :12]
    tg, skip = _skipping_targets(random3x3, toks)
    pe = ri.path_expansion(random3x3, toks, targets=tg)
    full = ri.path_expansion(random3x3, toks)
    assert bool((pe.contributions[:, skip] == 0).all()) and torch.equal(pe.targets, tg)
    picked = full.contributions.gather(-1, tg.clamp(min=0)[None, ..., None].expand(len(full.labels), -1, -1, 1))[..., 0]
    assert (pe.contributions[:, ~skip] - picked[:, ~skip]).abs().max() <= 1e-10
    att = ri.path_logit_attribution(random3x3, toks, targets=tg)
    logits = random3x3(toks).detach()
    want = (logits.gather(-1, tg.clamp(min=0)[..., None])[..., 0] - logits.mean(-1))[~skip]
    assert att.centered.shape[1] == int((~skip).sum())
    assert (att.centered.sum(0) - want).abs().max() <= 1e-10
    with pytest.raises(ValueError, match="no scored positions"):
        ri.path_logit_attribution(random3x3, toks, targets=torch.full_like(toks, -1))


def test_targets_below_minus_one_are_refused(random3x3, small_batch):
    toks = small_batch.tokens[:1, :8]
    for call in (lambda t: ri.path_expansion(random3x3, toks, targets=t), lambda t: ri.direct_logit_attribution(random3x3, toks, targets=t),
                 lambda t: ri.logit_lens(random3x3, toks, targets=t)):
        with pytest.raises(ValueError, match="targets"):
            call(torch.full_like(toks, -2))
