"""The stream's basis (issue 62): a lens fitted on raw weights maps exactly onto a centred stream (``P J + (I - P)``
equals the lens fitted there, to 1e-10 in float64), through ``load_pretrained``'s processing to its rounding; the
refusals where no map is exact, and of another model's lens."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.readouts.jacobian_basis import in_model_basis, stream_basis
from rs_interp.readouts.jacobian_lens import CENTRED, RAW
from tests.builders import make_variant
from tests.hf_families import save_checkpoint
from tests.readouts.test_jacobian_fit import random_prompts


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    save_checkpoint("gpt2", folder)
    return folder


@pytest.fixture(scope="module")
def fitted():
    model = make_variant("LN", "standard", False, n_layers=3)
    return model, ri.fit_jacobian_lens(model, random_prompts(50, (9, 8)), skip_first=2, progress=False)


def _centre_writes(model):
    """Every write into the stream made mean-free by hand (TransformerLens's center_writing_weights, on any norm)."""
    state = _backend.portable_state(model)
    for name, p in state.items():
        if name.endswith(("W_E", "W_pos", "W_O", "b_O", "W_out", "b_out")):
            state[name] = p - p.mean(-1, keepdim=True)
    _backend.load_portable_state(model, state)
    return model


def test_a_raw_lens_maps_exactly_onto_the_centred_stream():
    """Every write made mean-free in float64 (center_writing_weights, exactly): the lens fitted on the raw weights,
    mapped ``P J + (I - P)``, is the lens fitted on the centred ones; the readings agree through either."""
    raw = make_variant("LN", "standard", False, n_layers=3)
    centred = _centre_writes(make_variant("LN", "standard", False, n_layers=3))
    assert (stream_basis(raw), stream_basis(centred)) == (RAW, CENTRED)
    prompts = random_prompts(50, (9, 8))
    lens = ri.fit_jacobian_lens(raw, prompts, skip_first=2, progress=False)
    own = ri.fit_jacobian_lens(centred, prompts, skip_first=2, progress=False)
    assert (lens.basis, own.basis) == (RAW, CENTRED)
    mapped = in_model_basis(lens, centred, "test")
    assert (mapped - own.jacobians).abs().max() <= 1e-10 * own.jacobians.abs().max()
    assert torch.equal(in_model_basis(own, centred, "test"), own.jacobians)
    tokens = torch.stack([p[:7] for p in prompts])
    a, b = ri.jacobian_lens(centred, tokens, lens, full=True), ri.jacobian_lens(raw, tokens, lens, full=True)
    assert (a.log_probs - b.log_probs).abs().max() <= 1e-10
    with pytest.raises(ValueError, match="fitted on a centred stream"):
        ri.jacobian_lens(raw, tokens, own)


@pytest.mark.slow
def test_a_raw_lens_maps_onto_a_processed_checkpoint(gpt2_dir):
    """``load_pretrained``'s processing (fold_ln, center_writing_weights, center_unembed; 3.x processes in float32,
    4.x boots Hugging Face modules): the map holds to that processing's rounding."""
    prompts = [torch.randint(0, 299, (9,), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    raw = ri.load_pretrained(gpt2_dir, fold_ln=False, dtype=torch.float64)
    processed = ri.load_pretrained(gpt2_dir, dtype=torch.float64)
    assert (stream_basis(raw), stream_basis(processed)) == (RAW, CENTRED)
    lens = ri.fit_jacobian_lens(raw, prompts, skip_first=2, progress=False)
    own = ri.fit_jacobian_lens(processed, prompts, skip_first=2, progress=False)
    assert (in_model_basis(lens, processed, "test") - own.jacobians).abs().max() <= 1e-6 * own.jacobians.abs().max()
    tokens = torch.stack(prompts)
    a, b = ri.jacobian_lens(processed, tokens, lens, full=True), ri.jacobian_lens(raw, tokens, lens, full=True)
    assert (a.log_probs - b.log_probs).abs().max() <= 1e-6


def test_a_raw_lens_on_a_centred_stream_read_by_rms_norms_is_refused():
    model = make_variant("RMS", "standard", False)
    lens = ri.fit_jacobian_lens(model, random_prompts(50), skip_first=2, progress=False)
    _centre_writes(model)
    assert stream_basis(model) == CENTRED
    with pytest.raises(ValueError, match="not every reader of the stream subtracts its mean"):
        ri.jacobian_lens(model, torch.zeros(1, 4, dtype=torch.long), lens)


def test_a_lens_of_another_model_is_refused(fitted):
    model, lens = fitted
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="d_model=8"):
        ri.jacobian_lens(model, tokens, ri.JacobianLens(torch.zeros(1, 8, 8), (0,), n_prompts=1))
    with pytest.raises(ValueError, match="source layers"):
        ri.jacobian_lens(model, tokens, ri.JacobianLens(torch.zeros(1, 16, 16), (2,), n_prompts=1))
    with pytest.raises(ValueError, match="to layer 5"):
        ri.jacobian_lens(model, tokens, ri.JacobianLens(torch.zeros(1, 16, 16), (0,), 1, {"target_layer": 5}))
