"""The hook factories of rs_interp.hooks, each applied through model.hooks(...) on a toy model."""

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp import hooks as H


@pytest.fixture(scope="module")
def model():
    return ri.models.make_attn_only(2, seed=1, dtype=torch.float64)


@pytest.fixture(scope="module")
def tokens():
    return ri.induction_batch(3, seed=4).tokens


def test_store_records_without_changing(model, tokens):
    box = {}
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", H.store(box)), ("hook_embed", H.store(box, "e")),
                                *H.store_matching(box, model, lambda n: n == "blocks.0.hook_resid_post")]):
        out = model(tokens)
    assert torch.equal(out, model(tokens))
    assert box["blocks.0.attn.hook_z"].shape == (3, 48, 2, 16) and torch.equal(box["e"], model.W_E[tokens])
    # keyed by the name asked for, also where TransformerLens 4 names the point otherwise (blocks.0.hook_out)
    assert box["blocks.0.hook_resid_post"].shape == (3, 48, 32)


def test_replace_swaps_the_activation(model, tokens):
    zeros = torch.zeros(32, dtype=torch.float64)
    with model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", H.replace(zeros)), ("blocks.1.hook_attn_out", H.replace(zeros))]):
        out = model(tokens)
    assert torch.allclose(out, model.W_E[tokens] @ model.W_U, atol=1e-12)  # only the direct path is left


def test_add_shifts_the_stream(model, tokens):
    delta = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", H.add(delta))]):
        out = model(tokens)
    assert torch.allclose(out - model(tokens), (delta @ model.W_U).expand_as(out), atol=1e-10)


@pytest.mark.parametrize("head_indices", [None, [0], [1]])
def test_replace_heads_targets_only_the_chosen_heads(model, tokens, head_indices):
    box = {}
    value = torch.zeros(3, 48, 32, dtype=torch.float64)
    hooks = [("blocks.1.hook_k_input", H.replace_heads(value, head_indices=head_indices)), ("blocks.1.attn.hook_k", H.store(box, "k"))]
    # Per-head inputs: TransformerLens's split inputs, or their emulation on 4.x native attention.
    with _backend.per_head_inputs(model, hooks) as runnable, model.hooks(fwd_hooks=runnable):
        model(tokens)
    assert not model.cfg.use_split_qkv_input
    changed = [0, 1] if head_indices is None else head_indices
    for h in range(2):
        is_bias = torch.allclose(box["k"][:, :, h], model.blocks[1].attn.b_K[h].expand(3, 48, 16))
        assert is_bias == (h in changed)  # a zero input leaves exactly the key bias


def test_replace_heads_needs_split_inputs(model, tokens):
    with pytest.raises(ValueError, match="per-head input"):
        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", H.replace_heads(torch.zeros(3, 48, 32)))]):
            model(tokens)
