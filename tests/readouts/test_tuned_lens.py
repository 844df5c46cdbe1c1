"""Issue 20 item 6: the tuned lens (per-point affine translators) beside the logit lens."""

import pytest
import torch

import rs_interp as ri


def _logit_lens_kl(model, toks):
    """KL(final || logit lens) per point, from logit_lens's full log-distributions (written apart)."""
    lens = ri.logit_lens(model, toks, full=True)
    final = lens.log_probs[-1]
    return torch.stack([(final.exp() * (final - lp)).sum(-1).mean() for lp in lens.log_probs[:-1]])


def test_untrained_translators_are_the_logit_lens(gpt2_tiny):
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (3, 16), generator=torch.Generator().manual_seed(0))
    zero = ri.train_tuned_lens(gpt2_tiny, toks, steps=0, progress=False)
    assert zero.labels == ("embed", "L0") and not zero.weight.any() and not zero.bias.any()
    want = _logit_lens_kl(gpt2_tiny, toks)
    assert (ri.lens_kl(gpt2_tiny, toks, zero) - want).abs().max() <= 1e-5
    assert (ri.lens_kl(gpt2_tiny, toks) - want).abs().max() <= 1e-5


def test_training_lowers_the_kl_and_leaves_the_model_alone(gpt2_tiny, tmp_path):
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (8, 32), generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in gpt2_tiny.state_dict().items()}
    tuned = ri.train_tuned_lens(gpt2_tiny, toks, steps=150, lr=3e-3, progress=False)
    assert all(p.grad is None for p in gpt2_tiny.parameters())
    assert all(torch.equal(before[k], v) for k, v in gpt2_tiny.state_dict().items())
    held = torch.randint(0, gpt2_tiny.cfg.d_vocab, (8, 32), generator=torch.Generator().manual_seed(2))
    logit, tuned_kl = ri.lens_kl(gpt2_tiny, held), ri.lens_kl(gpt2_tiny, held, tuned)
    assert (tuned_kl < logit).all(), (logit, tuned_kl)  # held-out tokens: the translators generalise
    again = ri.TunedLens.load(tuned.save(tmp_path / "tuned"))
    assert again.labels == tuned.labels and torch.equal(again.weight, tuned.weight) and again.metadata == tuned.metadata
    assert torch.equal(ri.lens_kl(gpt2_tiny, held, again), tuned_kl)


def test_bad_input(gpt2_tiny):
    with pytest.raises(ValueError, match="steps"):
        ri.train_tuned_lens(gpt2_tiny, torch.zeros(1, 4, dtype=torch.long), steps=-1)


def test_a_lens_from_another_model_is_refused(gpt2_tiny):
    """A lens records the norms of the weights it read; another model of the same shape is refused
    by name, a float64 copy of the same model is not, and ``strict=False`` applies it anyway."""
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(3))
    tuned = ri.train_tuned_lens(gpt2_tiny, toks, steps=2, progress=False)
    other = ri.as_dtype(gpt2_tiny, torch.float32)
    state = ri._backend.portable_state(other)
    state["unembed.W_U"] = state["unembed.W_U"] * 1.1
    ri._backend.load_portable_state(other, state)
    with pytest.raises(ValueError, match=r"trained on another model \(\|W_U\|"):
        ri.lens_kl(other, toks, tuned)
    assert ri.lens_kl(other, toks, tuned, strict=False).isfinite().all()
    assert (ri.lens_kl(ri.as_dtype(gpt2_tiny, torch.float64), toks, tuned) - ri.lens_kl(gpt2_tiny, toks, tuned)).abs().max() <= 1e-5
    deeper = ri.models.make_attn_only(3, d_model=gpt2_tiny.cfg.d_model)
    with pytest.raises(ValueError, match="trained on another model"):
        ri.lens_kl(deeper, torch.zeros(1, 4, dtype=torch.long), tuned)
