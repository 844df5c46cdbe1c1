import pytest
import torch

import rs_interp as ri


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
    assert "b_U" in pe.labels and any(l.startswith("bias L0>") for l in pe.labels)
    assert (pe.total() - random3x3(small_batch.tokens)).abs().max() <= 1e-10


@pytest.mark.parametrize("shape", [dict(n_layers=1), dict(n_layers=3, n_heads=1, d_head=32), dict(n_layers=2, positional_embedding_type="standard")])
def test_other_shapes(shape, small_batch):
    model = ri.make_attn_only(seed=4, dtype=torch.float64, **shape)
    pe = ri.path_expansion(model, small_batch.tokens)
    assert len(pe.labels) == (1 + model.cfg.n_heads) ** model.cfg.n_layers
    assert (pe.total() - model(small_batch.tokens)).abs().max() <= 1e-10


def test_layer1_paths_carry_the_answer(toy2, test_set):
    att = ri.path_logit_attribution(toy2, test_set)
    assert float(att.share_ending_in(1).median()) >= 0.80  # theory > 0.90
    assert att.top1_without_last_layer <= 0.10  # theory < 0.05
    assert torch.allclose(att.share.sum(0), torch.ones(att.share.shape[1]), atol=1e-4)


def test_refuses_layernorm_models(small_batch):
    model = ri.make_attn_only(2, normalization_type="LN")
    with pytest.raises(ValueError, match="direct_logit_attribution"):
        ri.path_expansion(model, small_batch.tokens)


def test_dla_sums_to_the_metric_on_a_gpt2_shaped_model(gpt2_tiny):
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    tg = toks.roll(-1, 1)
    dla = ri.direct_logit_attribution(gpt2_tiny, toks, targets=tg)
    n_heads = gpt2_tiny.cfg.n_layers * gpt2_tiny.cfg.n_heads
    assert sum(l.startswith("L") for l in dla.labels) == n_heads
    assert (dla.total() - dla.metric).abs().max() <= 1e-4
    other = toks
    diff = ri.direct_logit_attribution(gpt2_tiny, toks, targets=tg, contrast=other)
    assert (diff.total() - diff.metric).abs().max() <= 1e-4
