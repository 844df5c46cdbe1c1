"""The Jacobian lens's backward passes by hand (issue 62): equal to autograd's on every block form they take (both
modes: every cotangent at once with the MLPs' per-position Jacobians, and batches through the hidden layer); where
the certificate cannot read the blocks off the weights the fit keeps autograd, and stays exact."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.readouts.jacobian_backward import by_hand
from tests.builders import architecture_params, make_variant, variant_id
from tests.mutations import MUTATIONS
from tests.readouts.test_jacobian_fit import brute_force, random_prompts

FORMS = [("LN", "standard", False), ("LNPre", "standard", True), ("RMS", "standard", False),
         (None, "standard", False), ("RMSPre", "standard", False, "gqa")]


def _both(model, prompts, **kwargs):
    hand = [ri.fit_jacobian_lens(model, prompts, skip_first=2, progress=False, batch_size=5, memory_budget=budget,
                                 **kwargs) for budget in (2**30, 1)]  # every cotangent at once; 5 at a time
    auto = ri.fit_jacobian_lens(model, prompts, skip_first=2, progress=False, batch_size=7, backward="autograd",
                                **kwargs)
    return hand, auto


@pytest.mark.parametrize("variant", FORMS + architecture_params([("LN", "standard", False, "parallel")]),
                         ids=lambda v: variant_id(v) if isinstance(v, tuple) else None)
@pytest.mark.parametrize("act", ["gelu_new", "relu", "silu"])
def test_by_hand_is_autograd(variant, act):
    if variant[2] and act != "gelu_new":
        pytest.skip("attention-only: no activation")
    model = make_variant(*variant, n_layers=3, n_ctx=12, **({} if variant[2] else {"act_fn": act}))
    assert by_hand(model, ri.certify(model)) is None
    hand, auto = _both(model, random_prompts(50, (11, 9)), source_layers=[0, 1])
    for lens in hand:
        assert (lens.jacobians - auto.jacobians).abs().max() <= 1e-12 * auto.jacobians.abs().max()


def test_a_later_first_source_layer_and_a_booted_checkpoint(tmp_path):
    from tests.hf_families import save_checkpoint

    save_checkpoint("gpt2", tmp_path)
    model = ri.load_pretrained(tmp_path, dtype=torch.float64)  # 4.x: Hugging Face modules in a bridge
    assert by_hand(model, ri.certify(model)) is None
    hand, auto = _both(model, random_prompts(299, (10,)), source_layers=[0])
    tol = 1e-12 if ri.certify(model).source == "native" else 1e-9
    assert all((lens.jacobians - auto.jacobians).abs().max() <= tol * auto.jacobians.abs().max() for lens in hand)


@pytest.mark.parametrize("identity", ["mlp weights", "scores", "stream"])
def test_a_block_the_weights_do_not_say_is_left_to_autograd(identity):
    model = make_variant("LN", "standard", False, n_layers=3, act_fn="relu")
    MUTATIONS[identity](model)
    why = by_hand(model, ri.certify(model))
    assert why is not None and identity in why
    prompts = random_prompts(50, (9,))
    lens = ri.fit_jacobian_lens(model, prompts, skip_first=2, progress=False)
    for layer in (0, 1):
        want = brute_force(model, prompts, layer, 2)
        assert (lens.matrix(layer) - want).abs().max() <= 1e-10 * want.abs().max()


def test_the_forms_it_does_not_take_are_named():
    m = make_variant("LN", "rotary", False)
    assert "rotary" in by_hand(m, ri.certify(m))
    with pytest.raises(ValueError, match="backward must be one of"):
        ri.fit_jacobian_lens(m, random_prompts(50), skip_first=2, backward="hand", progress=False)
