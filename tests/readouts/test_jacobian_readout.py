"""Reading through a Jacobian lens (issue 62): with every matrix the identity, the logit lens bit for bit; a point is
the model's own readout of ``J h``, written out from the weights."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from tests.builders import make_variant, variant_id


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
