import pytest
import torch

import rs_interp as ri
from rs_interp.reproduce.expected import EXPECTED


def _next_targets(tokens):
    return torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -1)], 1)


def test_answer_appears_only_after_layer1(toy2, test_set):
    tg = _next_targets(test_set.tokens)
    lens = ri.logit_lens(toy2, test_set.tokens, targets=tg, batch_chunk=250)
    mask = torch.cat([test_set.scored, torch.zeros_like(test_set.scored[:, :1])], 1)
    p = [float(lens.target_probs[i][mask].mean()) for i in range(3)]
    assert lens.labels == ("embed", "L0", "L1")
    assert [EXPECTED[f"logit_lens.{k}"].holds(v) for k, v in zip(("embed", "layer0", "layer1"), p)] == [True] * 3
    assert lens.target_probs[:, :, -1].isnan().all()


def test_last_reading_is_the_model_output(toy2, small_batch):
    lens = ri.logit_lens(toy2, small_batch.tokens, full=True, k=3, row_chunk=100, batch_chunk=7)
    lp = toy2(small_batch.tokens).log_softmax(-1)
    # float32 rounding at the scale of the logits (|logit| ~ 20 here: a few eps x 20)
    assert (lens.log_probs[-1] - lp).abs().max() <= 1e-5
    assert torch.equal(lens.top_tokens[-1], lp.topk(3, -1).indices)
    ent = -(lp.exp() * lp).sum(-1)
    assert (lens.entropy[-1] - ent).abs().max() <= 1e-5


def test_layernorm_model_reads_with_its_own_scale(gpt2_tiny):
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (2, 10), generator=torch.Generator().manual_seed(1))
    lens = ri.logit_lens(gpt2_tiny, toks, full=True, sublayers=True)
    n = gpt2_tiny.cfg.n_layers
    assert len(lens.labels) == 1 + 2 * n and lens.labels[1] == "L0 attn"
    lp = gpt2_tiny(toks).log_softmax(-1)
    assert (lens.log_probs[-1] - lp).abs().max() <= 1e-5
    _, cache = gpt2_tiny.run_with_cache(toks)
    mid = gpt2_tiny.unembed(gpt2_tiny.ln_final(cache["blocks.0.hook_resid_post"])).log_softmax(-1)
    assert (lens.log_probs[2] - mid).abs().max() <= 1e-5


@pytest.mark.parametrize("bad", [torch.zeros(2, 3, dtype=torch.long), torch.full((1, 48), 256)])
def test_bad_targets(toy2, small_batch, bad):
    with pytest.raises(ValueError, match="targets"):
        ri.logit_lens(toy2, small_batch.tokens[:1], targets=bad)


@pytest.mark.parametrize("vocab_tile", [37, 4096])
@pytest.mark.parametrize("which", ["toy2", "gpt2_tiny"])
def test_tiled_reading_equals_the_full_distribution(which, vocab_tile, request, small_batch):
    """The online-softmax reading (tiles of the vocabulary) gives what the full log-distribution gives."""
    model = request.getfixturevalue(which)
    toks = small_batch.tokens[:3, :20] % model.cfg.d_vocab
    targets = ri.next_token_targets(toks)
    tiled = ri.logit_lens(model, toks, targets=targets, k=4, vocab_tile=vocab_tile, row_chunk=17)
    full = ri.logit_lens(model, toks, targets=targets, k=4, full=True)
    lp = full.log_probs
    assert torch.equal(tiled.top_tokens, lp.topk(4, -1).indices)
    # float32 rounding at the logits' scale (|logit| ~ 20: a few eps x 20)
    assert (tiled.top_probs - lp.topk(4, -1).values.exp()).abs().max() <= 1e-5
    assert (tiled.entropy - (-(lp.exp() * lp).sum(-1))).abs().max() <= 5e-5  # log Z - d / s: both ~ the logits
    assert torch.equal(tiled.target_probs.isnan(), full.target_probs.isnan())
    ok = ~full.target_probs.isnan()
    assert (tiled.target_probs[ok] - full.target_probs[ok]).abs().max() <= 1e-5
