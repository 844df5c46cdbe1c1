"""rs_interp._state: a model left in training mode with active dropout is computed in eval mode (dropout off) and the
mode restored, and the user is told so once (issue 61: it was silent). On a TransformerLens 4 bridge of a Hugging Face
GPT-2 checkpoint (its own ``Dropout`` modules, p = 0.1), and on any model with a dropout module attached (both versions:
TransformerLens 3's models have none of their own)."""

from __future__ import annotations

import warnings

import pytest
import torch

import rs_interp as ri
from rs_interp._state import DROPOUT_WARNING
from tests.builders import TL4


def _dropout_model(kind: str, tmp_path):
    if kind == "attached":
        model = ri.models.make_attn_only(2, n_heads=2, d_model=16, d_head=8, d_vocab=20, n_ctx=8)
        model.add_module("extra_dropout", torch.nn.Dropout(0.5))  # a submodule whose training flag the helpers flip
        return model.to(torch.float64)
    if not TL4:
        pytest.skip("TransformerLens 3 converts Hugging Face checkpoints to its own modules: no dropout")
    from tests.hf_families import save_checkpoint

    save_checkpoint("gpt2", tmp_path / "gpt2")
    return ri.load_pretrained(tmp_path / "gpt2", dtype=torch.float64)


@pytest.mark.parametrize("kind", ["attached", "hf-gpt2"])
def test_training_mode_with_dropout_is_computed_in_eval_mode_and_said_once(kind, tmp_path):
    model = _dropout_model(kind, tmp_path)
    tokens = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    targets = ri.next_token_targets(tokens)
    model.eval()
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("default")
        want = ri.direct_logit_attribution(model, tokens, targets=targets).contributions
    assert not [w for w in quiet if "training mode" in str(w.message)]  # eval mode: nothing to say
    model.train()
    flags = [m.training for m in model.modules()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default: once per place raised from
        got = [ri.direct_logit_attribution(model, tokens, targets=targets).contributions for _ in range(2)]
    said = [str(w.message) for w in caught if "training mode" in str(w.message)]
    assert len(said) == 1, said  # once, not per call
    assert said[0].startswith(DROPOUT_WARNING.split("{")[0]) and "p = " in said[0] and len(said[0]) <= 400
    assert all(torch.equal(g, want) for g in got)  # the eval-mode numbers, not a dropped-out draw
    assert [m.training for m in model.modules()] == flags  # the mode as found


def test_no_warning_without_active_dropout():
    model = ri.models.make_attn_only(1, n_heads=1, d_model=8, d_head=8, d_vocab=10, n_ctx=4)
    model.add_module("off", torch.nn.Dropout(0.0))
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokens = torch.zeros(1, 4, dtype=torch.long)
        ri.direct_logit_attribution(model, tokens, targets=tokens)


def test_outside_inference_mode_runs_the_function_with_autograd_on_copies():
    """The one inference-mode escape (issue 65): inside ``torch.inference_mode()`` the function runs with it off, on
    normal copies of its tensor arguments (an inference tensor cannot be saved for backward); outside, as called."""
    from rs_interp._state import outside_inference_mode

    @outside_inference_mode
    def seen(x, *, scale):
        y = (x.double() * scale).requires_grad_(True)
        (g,) = torch.autograd.grad((y * y).sum(), y)
        return torch.is_inference_mode_enabled(), x.is_inference(), scale.is_inference(), g

    x = torch.arange(3.0)
    assert seen(x, scale=torch.tensor(2.0))[:3] == (False, False, False)
    with torch.inference_mode():
        x_inf, s_inf = torch.arange(3.0), torch.tensor(2.0)
        mode, x_is, s_is, g = seen(x_inf, scale=s_inf)
        assert torch.is_inference_mode_enabled(), "the caller's mode is restored"
    assert (mode, x_is, s_is) == (False, False, False) and g.tolist() == [0.0, 4.0, 8.0]
    assert seen.__name__ == "seen"


def test_frozen_restores_exactly_the_gradients_it_turned_off():
    from rs_interp._state import frozen

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[1].bias.requires_grad_(False)
    with pytest.raises(RuntimeError, match="inside"):
        with frozen(model):
            assert not any(p.requires_grad for p in model.parameters())
            raise RuntimeError("inside")
    assert [p.requires_grad for p in model.parameters()] == [True, True, True, False]
