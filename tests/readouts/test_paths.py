"""Path expansion (rs_interp.readouts.paths): the paths of an attention-only model sum to its logits, on
every shape and positional scheme, biases included; path attribution; hooks and skipped targets."""

import pytest
import torch

import rs_interp as ri
from rs_interp.reproduce.expected import EXPECTED
from tests.builders import POSITIONS, TL4, make_variant, skipping_targets

# builders.perturb draws b_U on 3.x only (the 4.x suite's numbers were measured without it): its path is there on 3.x only.
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
    model = ri.models.make_attn_only(seed=4, dtype=torch.float64, **shape)
    pe = ri.path_expansion(model, small_batch.tokens)
    assert len(pe.labels) == (1 + model.cfg.n_heads) ** model.cfg.n_layers
    assert (pe.total() - model(small_batch.tokens)).abs().max() <= 1e-10


def test_layer1_paths_carry_the_answer(toy2, test_set):
    att = ri.path_logit_attribution(toy2, test_set.tokens, targets=test_set.targets)
    assert EXPECTED["paths.layer1_share"].holds(float(att.share_ending_in(1).median()))
    assert EXPECTED["paths.top1_without_last"].holds(att.top1_without_last_layer)
    assert torch.allclose(att.share.sum(0), torch.ones(att.share.shape[1]), atol=1e-4)


def test_refuses_layernorm_models(small_batch):
    model = ri.models.make_attn_only(2, normalization_type="LN")
    with pytest.raises(ValueError, match="direct_logit_attribution"):
        ri.path_expansion(model, small_batch.tokens)



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


# ---- targets=-1 skips a position, in every helper that takes targets ------------------------------------------------


def test_path_helpers_skip_minus_one(random3x3, small_batch):
    """path_expansion: 0 at skipped positions, elsewhere the full-vocabulary expansion read at the target;
    path_logit_attribution: one column per kept position, summing to the centered logit there (1e-10)."""
    toks = small_batch.tokens[:3, :12]
    tg, skip = skipping_targets(random3x3, toks)
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
