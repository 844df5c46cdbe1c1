"""Reading through a Jacobian lens (issue 62): with every matrix the identity, the logit lens bit for bit; a point is
the model's own readout of ``J h``, written out from the weights."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from tests.builders import architecture_params, make_variant, variant_id
from tests.hf_families import save_checkpoint


@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMS", "rotary", False, "gqa")], ids=variant_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_identity_lens_is_the_logit_lens_bit_for_bit(variant, dtype):
    model = make_variant(*variant, n_layers=3, dtype=dtype)
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(1))
    targets = ri.next_token_targets(tokens)
    identity = ri.JacobianLens(torch.eye(16, dtype=dtype).repeat(2, 1, 1), (0, 1), n_prompts=1)
    for kwargs in ({}, {"row_chunk": 7, "vocab_tile": 9, "batch_chunk": 2}, {"full": True}):
        got = ri.jacobian_lens(model, tokens, identity, targets=targets, k=4, **kwargs)
        want = ri.logit_lens(model, tokens, targets=targets, k=4, **kwargs)
        assert got.labels == want.labels and got.transported == (False, True, True, False)
        for name in ("top_tokens", "top_probs", "entropy", "target_probs", "log_probs"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None and b is None) or torch.equal(a.nan_to_num(), b.nan_to_num()), name


def test_the_readout_reads_the_transported_stream():
    """A point of the readout is the model's own readout of ``J h``, written out from the weights."""
    model = make_variant("LN", "standard", False, n_layers=3)
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    lens = ri.fit_jacobian_lens(model, tokens, skip_first=2, progress=False)
    got = ri.jacobian_lens(model, tokens, lens, full=True)
    _, cache = model.run_with_cache(tokens)
    for i, layer in enumerate((0, 1)):
        y = cache[f"blocks.{layer}.hook_resid_post"] @ lens.matrix(layer).T
        y = torch.nn.functional.layer_norm(y, (16,), model.ln_final.w, model.ln_final.b, eps=model.cfg.eps)
        want = (y @ model.W_U + model.b_U).log_softmax(-1)
        assert (got.log_probs[1 + i] - want).abs().max() <= 1e-10
    assert (got.log_probs[-1] - model(tokens).log_softmax(-1)).abs().max() <= 1e-10
    assert got.top(2, position=3)[1][1][0][0] == int(got.top_tokens[1, 0, 3, 0])


# --- files ------------------------------------------------------------------------------------------------------


def near_identity_lens(model, seed=0):
    """A lens of random matrices ``I + 0.3 G / sqrt(d)`` at every source layer, in the model's basis."""
    d, n = model.cfg.d_model, model.cfg.n_layers - 1
    G = torch.randn(n, d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ri.JacobianLens(torch.eye(d, dtype=torch.float64) + 0.3 * G / d ** 0.5, tuple(range(n)), n_prompts=1)


def read_by_the_model(model, tokens, layer, J):
    """The brute force: the model's own log-probabilities with the last block's output replaced by ``J h_layer``
    (plain hooks on the raw forward: its final norm, unembedding, logit scaling and soft-cap as they are)."""
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.hook_resid_post")
    h = cache[f"blocks.{layer}.hook_resid_post"].double() @ J.T
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    return model.run_with_hooks(tokens, fwd_hooks=[(last, lambda t, hook: h.to(t.dtype))]).double().log_softmax(-1)


def _check_readout_by_the_model(model, tokens, rel):
    lens = near_identity_lens(model)
    got = ri.jacobian_lens(model, tokens, lens, full=True)
    for i, layer in enumerate(lens.source_layers):
        want = read_by_the_model(model, tokens, layer, lens.matrix(layer))
        assert (got.log_probs[1 + i].double() - want).abs().max() <= rel * want.abs().max(), layer


#: variants beyond the fitted one, for the brute forces here and in test_lens_interventions.py
BEYOND = [("RMSPre", "rotary", False, "gated"), (None, "standard", False), ("RMS", "rotary", False, "gqa")] \
    + architecture_params([("LNPre", "standard", True, "gqa"), ("LN", "rotary", False, "parallel"),
                           ("RMS", "rotary", False, "qk_norm")])


def beyond_id(v):
    return variant_id(v) if isinstance(v, tuple) else None


def post_norm_soft_capped(folder, native_rel):
    """gemma2 (post-norms, logits soft-capped, grouped-query attention) from a Hugging Face checkpoint in ``folder``,
    float64, with the relative tolerance of a check: ``native_rel``, or 1e-6 booted (some steps in float32 inside)."""
    save_checkpoint("gemma2", folder)
    model = ri.load_pretrained(folder, dtype=torch.float64)
    assert model.cfg.output_logits_soft_cap > 0
    return model, native_rel if _backend.model_source(model) == "native" else 1e-6


@pytest.mark.parametrize("variant", BEYOND, ids=beyond_id)
def test_each_point_is_the_models_own_readout_of_the_transported_stream(variant):
    model = make_variant(*variant, n_layers=3)
    _check_readout_by_the_model(model, torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2)), 1e-12)


@pytest.mark.slow  # a Hugging Face checkpoint written and loaded: seconds
def test_a_post_norm_soft_capped_family_reads_as_the_model_does(tmp_path):
    model, rel = post_norm_soft_capped(tmp_path, 1e-12)
    _check_readout_by_the_model(model, torch.randint(1, 299, (2, 9), generator=torch.Generator().manual_seed(2)), rel)
