"""Fitting the Jacobian lens (issue 62): each fitted matrix against a brute force
(``torch.autograd.functional.jacobian`` of the final stream with respect to a layer's, summed over ``t' >= t`` and
averaged as the reference defines it) on tiny float64 models of several families, to 1e-10; the defaults and skipped
prompts; the checkpoint resumed; refusals."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from tests.builders import architecture_params, make_variant, variant_id
from tests.hf_families import save_checkpoint


def final_stream_of(model, tokens, layer, x):
    """The final stream (1, pos, d_model) with ``blocks.layer.hook_resid_post`` replaced by ``x``: plain hooks."""
    out = {}
    model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_resid_post", lambda t, hook: x),
                                            (f"blocks.{model.cfg.n_layers - 1}.hook_resid_post",
                                             lambda t, hook: out.__setitem__("y", t))])
    return out["y"]


def brute_force(model, prompts, layer, skip_first):
    """``mean over prompts of (1/|V|) sum_{t in V} sum_{t' in V, t' >= t} d h_final[t'] / d h_layer[t]``, every
    per-position block from the full Jacobian (pos, d, pos, d) of one prompt at a time."""
    total = 0
    for tokens in prompts:
        tokens = tokens.reshape(1, -1)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == f"blocks.{layer}.hook_resid_post")
        x0 = cache[f"blocks.{layer}.hook_resid_post"].clone()
        jac = torch.autograd.functional.jacobian(lambda x: final_stream_of(model, tokens, layer, x), x0)[0, :, :, 0]
        V = range(skip_first, tokens.shape[1] - 1)
        total = total + sum(jac[tp, :, t, :] for t in V for tp in V if tp >= t) / len(V)
    return total / len(prompts)


def random_prompts(d_vocab, lengths=(9, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, d_vocab, (n,), generator=g) for n in lengths]


def _check_against_brute_force(model, prompts, skip_first, rel=1e-10):
    lens = ri.fit_jacobian_lens(model, prompts, skip_first=skip_first, batch_size=5, progress=False)
    assert lens.source_layers == tuple(range(model.cfg.n_layers - 1)) and lens.n_prompts == len(prompts)
    for layer in lens.source_layers:
        want = brute_force(model, prompts, layer, skip_first)
        assert (lens.matrix(layer) - want).abs().max() <= rel * want.abs().max(), layer
    return lens


VARIANTS = [("LN", "standard", False), ("RMS", "rotary", False), ("LNPre", "standard", True), (None, "rotary", False)]


@pytest.mark.parametrize("variant", VARIANTS + architecture_params([("LN", "rotary", False, "parallel"),
                                                                     ("RMS", "rotary", False, "gqa")]),
                         ids=lambda v: variant_id(v) if isinstance(v, tuple) else None)
def test_each_matrix_is_the_averaged_jacobian(variant):
    model = make_variant(*variant, n_layers=3, n_ctx=12)
    _check_against_brute_force(model, random_prompts(50), skip_first=2)


# gemma2: post-norm blocks, soft-capped logits, grouped-query attention; gpt_neox: parallel blocks
@pytest.mark.parametrize("family", ["gemma2", pytest.param("gpt_neox", marks=pytest.mark.slow)])
def test_each_matrix_is_the_averaged_jacobian_on_hugging_face_families(family, tmp_path):
    save_checkpoint(family, tmp_path)
    model = ri.load_pretrained(tmp_path, dtype=torch.float64)
    tol = 1e-10 if _backend.model_source(model) == "native" else 1e-6  # booted: some steps in float32 inside
    _check_against_brute_force(model, random_prompts(299, lengths=(8,)), skip_first=1, rel=tol)


def test_the_cotangent_batch_only_tiles():
    model = make_variant("LN", "standard", False, n_layers=3, n_ctx=12)
    prompts = random_prompts(50)
    one = ri.fit_jacobian_lens(model, prompts, skip_first=2, batch_size=1, progress=False)
    many = ri.fit_jacobian_lens(model, prompts, skip_first=2, batch_size=16, progress=False)
    assert (one.jacobians - many.jacobians).abs().max() <= 1e-14


def test_the_defaults_and_the_skipped_prompts():
    model = make_variant("LN", "standard", False, n_ctx=40)
    prompts = [torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 17, 30)]
    with pytest.warns(UserWarning, match="prompt 1 has 17 tokens"):
        lens = ri.fit_jacobian_lens(model, prompts, progress=False)  # skip_first=16: 17 tokens leave no valid position
    assert lens.n_prompts == 2 and lens.metadata["skip_first_positions"] == 16 and lens.metadata["max_seq_len"] == 128
    want = brute_force(model, [prompts[0], prompts[2]], 0, 16)
    assert (lens.matrix(0) - want).abs().max() <= 1e-10 * want.abs().max()
    with pytest.raises(ValueError, match="no prompt has more than"):
        ri.fit_jacobian_lens(model, prompts[1:2], progress=False)
    # a (batch, pos) tensor is one prompt a row; max_seq_len truncates
    rows = torch.stack([prompts[0][:20], prompts[2][:20]])
    assert torch.equal(ri.fit_jacobian_lens(model, rows, max_seq_len=20, progress=False).jacobians,
                       ri.fit_jacobian_lens(model, [prompts[0], prompts[2]], max_seq_len=20, progress=False).jacobians)


def test_the_model_is_left_as_found():
    model = make_variant("LN", "standard", False)
    flags = [p.requires_grad for p in model.parameters()]
    ri.fit_jacobian_lens(model, random_prompts(50), skip_first=2, progress=False)
    assert [p.requires_grad for p in model.parameters()] == flags and not model.training
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())


@pytest.fixture(scope="module")
def fitted():
    model = make_variant("LN", "standard", False, n_layers=3)
    prompts = random_prompts(50, (9, 8, 10, 7))
    return model, ri.fit_jacobian_lens(model, prompts, skip_first=2, corpus="random", progress=False)


def test_a_checkpointed_fit_resumes_where_it_stopped(fitted, tmp_path):
    model, whole = fitted
    prompts = random_prompts(50, (9, 8, 10, 7))
    path = tmp_path / "fit.ckpt"
    ri.fit_jacobian_lens(model, prompts[:2], skip_first=2, corpus="random", checkpoint=path, progress=False)
    state = torch.load(path, weights_only=True)
    assert {"jacobian_sum", "n_done", "next_idx", "source_layers", "target_layer", "skip_first"} <= set(state)
    assert (state["n_done"], state["next_idx"], state["target_layer"]) == (2, 2, 2)
    resumed = ri.fit_jacobian_lens(model, prompts, skip_first=2, corpus="random", checkpoint=path, progress=False)
    assert (resumed.jacobians - whole.jacobians).abs().max() <= 1e-13 * whole.jacobians.abs().max()
    assert (ri.JacobianLens.load(path).jacobians - whole.jacobians).abs().max() <= 1e-13 * whole.jacobians.abs().max()
    with pytest.raises(ValueError, match="skip_first=2, not 3"):
        ri.fit_jacobian_lens(model, prompts, skip_first=3, checkpoint=path, progress=False)


def test_bidirectional_attention_is_refused_by_name():
    model = ri.load_toy_model("tracr-reverse")
    with pytest.raises(ValueError, match="fit_jacobian_lens refuses this model: bidirectional attention"):
        ri.fit_jacobian_lens(model, torch.zeros(1, 4, dtype=torch.long), progress=False)
