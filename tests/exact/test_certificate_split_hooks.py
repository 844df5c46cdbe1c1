"""A hook on a query projection module that the per-head inputs bypass (TransformerLens 4.3's split q/k/v inputs compute
the projections from the weights, never calling the Hugging Face module): the certificate's ``readers`` compares the
run through the per-head inputs with the model's own run, so the edge methods refuse instead of answering for the model
without the hook (before: EAP, the QK fix and path patching returned other numbers than a brute force under the hook,
e.g. Phi's QK-fixed edge L0H1 -> L1H0.q -0.018609 against -0.019256; scratch/qproj_hook.py on branch red)."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from tests.hf_families import save_checkpoint

pytestmark = pytest.mark.skipif(_backend.TL_MAJOR < 4, reason="3.x builds these attentions natively: no projection module")


@pytest.fixture(scope="module", params=["phi", "gemma3"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(request.param, folder)
    return ri.load_pretrained(folder, dtype=torch.float64)


def _q_proj(model):
    hf = model.blocks[1].attn.original_component
    return hf.q_proj if hasattr(hf, "q_proj") else model.blocks[1].attn.q.original_component


@pytest.mark.parametrize("shift", [0.0, 0.3])
def test_a_projection_hook_the_split_inputs_bypass_is_refused(model, shift):
    toks = torch.randint(0, 299, (2, 6), generator=torch.Generator().manual_seed(3))
    ref = torch.randint(0, 299, (2, 6), generator=torch.Generator().manual_seed(4))

    def metric(logits):
        return logits[:, -1, 1].mean()

    ri.edge_attribution_patching(model, toks, metric, reference=ref)  # certified (and cached) without the hook

    def shifted(module, args, out):
        return out + shift

    handle = _q_proj(model).register_forward_hook(shifted)
    try:
        if shift:
            with pytest.raises(ValueError, match="per-head inputs"):
                ri.edge_attribution_patching(model, toks, metric, reference=ref)
            with pytest.raises(ValueError, match="per-head inputs"):
                ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "logits")], progress=False)
        else:  # a hook that changes nothing: the split run is the model's, and the helper answers
            ri.edge_attribution_patching(model, toks, metric, reference=ref)
    finally:
        handle.remove()
