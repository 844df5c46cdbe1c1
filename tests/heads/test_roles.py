import pytest
import torch

import rs_interp as ri
from rs_interp.reproduce.expected import EXPECTED


def test_prev_token_head(toy2, test_set):
    prev = ri.prev_token_scores(toy2, test_set.tokens)
    ph = int(prev[0].argmax())
    assert EXPECTED["heads.prev_token_weight"].holds(float(prev[0, ph]))
    assert prev[0, 1 - ph] < 0.5


def test_prev_token_scores_on_a_known_pattern():
    """A head that attends only to i-1 scores 1; built by overriding the pattern with a hook."""
    model = ri.models.make_attn_only(1, seed=0)
    def shifted(t, hook):  # follows the shape it is given: the certificate's probe runs it too
        n = t.shape[-1]
        out = torch.zeros(n, n)
        out[0, 0] = 1.0
        out[torch.arange(1, n), torch.arange(n - 1)] = 1.0
        return out.expand_as(t).clone()

    tokens = torch.randint(0, 256, (3, 10))
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", shifted)]):
        prev = ri.prev_token_scores(model, tokens)
    assert torch.allclose(prev, torch.ones(1, 2))


def test_induction_heads(toy2, test_set):
    s = ri.induction_scores(toy2, test_set.tokens, periods=test_set.periods)
    assert all(EXPECTED[f"heads.induction_target_h{h}"].holds(float(s.induction[1, h])) for h in range(2))
    assert (s.after_occurrence[1] >= s.induction[1]).all()  # the target is one of the after-occurrence positions
    assert (s.induction[0] < 0.05).all()


def test_one_layer_model_has_no_induction_head(toy1, test_set):
    assert (ri.induction_scores(toy1, test_set.tokens, periods=test_set.periods).induction < 0.2).all()


def test_positional_scores_match_the_model(toy2):
    """The bias-only score from the kernel equals the model's score on an input whose stream is zero."""
    ps = ri.positional_scores(toy2, 0)
    assert ps.shape == (2, 48)
    # The model's own attention with the layer-0 stream set to zero: only the biases and positions
    # remain, and within a row the log-pattern differs from the scores by the row's normaliser.
    box = {}
    with toy2.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: torch.zeros_like(t)),
                               ("blocks.0.attn.hook_pattern", lambda t, hook: box.update(p=t.detach()))]):
        toy2(torch.zeros(1, 48, dtype=torch.long))
    log_p = box["p"][0, :, 45].log()  # (head, key)
    for delta in (1, 5, 39):
        assert torch.allclose(ps[:, delta] - ps[:, 0], log_p[:, 45 - delta] - log_p[:, 45], atol=1e-4)


def test_prev_token_head_kernel_peaks_at_one(toy2, test_set):
    ph = int(ri.prev_token_scores(toy2, test_set.tokens[:100])[0].argmax())
    ps = ri.positional_scores(toy2, 0, max_offset=10)[ph]
    assert int(ps.argmax()) == 1  # theory: 7.783 at offset 1 against 6.709 at 0


def test_proposition_5(toy1_f64, toy2_f64, test_set):
    tokens = test_set.tokens[:300]
    one = ri.key_score_sensitivity(toy1_f64, tokens)
    two = ri.key_score_sensitivity(toy2_f64, tokens)
    assert one.n_pairs > 1000
    assert one.max_abs_change.max() < 1e-10  # a one-layer score cannot see predecessors
    assert two.mean_abs_change.min() > 1.0  # theory: 4.45 on average


def test_positional_scores_need_rotary():
    model = ri.models.make_attn_only(1, positional_embedding_type="standard")
    with pytest.raises(ValueError, match="rotary"):
        ri.positional_scores(model, 0)


def test_first_token_attention_against_the_patterns(toy2, small_batch):
    """Brute force from hook_pattern directly, and the uniform baseline of causal attention."""
    toks = small_batch.tokens[:5]
    ft = ri.first_token_attention(toy2, toks, min_query=6)
    _, cache = toy2.run_with_cache(toks)
    for l in range(2):
        want = cache[f"blocks.{l}.attn.hook_pattern"][:, :, 6:, 0].mean(dim=(0, 2))
        assert torch.allclose(ft.mass[l], want, atol=1e-7)
    assert ft.uniform == pytest.approx(sum(1 / (i + 1) for i in range(6, 48)) / 42)
    assert torch.equal(ft.ratio(), ft.mass / ft.uniform)
    with pytest.raises(ValueError, match="min_query"):
        ri.first_token_attention(toy2, toks, min_query=48)


def test_first_token_attention_needs_two_positions(toy2):
    with pytest.raises(ValueError, match="at least 2 positions for first-token attention, got 1"):
        ri.first_token_attention(toy2, torch.tensor([[3]]))
