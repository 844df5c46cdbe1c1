"""Issue 64: 3.9's ``Unembed`` copies ``W_U.T`` at every call; the certificate's probe runs store ``W_U`` transposed for
the duration (``unembed_stored_transposed``), which leaves the model's forward and its logits to the bit, and the
model, its key included, as it was after (4.x: nothing to do)."""

from __future__ import annotations

import torch

from rs_interp import _backend
from rs_interp.exact._fingerprint import fingerprint
from tests.builders import make_variant


def test_the_unembedding_stored_transposed_is_the_same_function_and_is_put_back():
    model = make_variant("LN", "standard", False)
    tokens = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    key, W = fingerprint(model), model.W_U
    with torch.no_grad():
        want = model(tokens)
        with _backend.unembed_stored_transposed(model):
            inside = model.W_U
            got = model(tokens)
            assert inside.T.is_contiguous()  # 3.9's copy is then W_U.T itself (4.x holds W_U that way already)
            assert torch.equal(inside, W)
    assert torch.equal(got, want)
    assert fingerprint(model) == key and model.W_U.is_contiguous() == W.is_contiguous()
