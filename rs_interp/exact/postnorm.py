"""Post-norm blocks: a norm ``P`` on each sublayer's output before it enters the stream (Gemma-2, Gemma-3,
OLMo-2), and what a head writes there, by each of rs_interp's three conventions.

A layer's attention adds ``P(r)`` to the stream, ``r = sum_h z_h W_O^h + b_O`` (the raw attention output;
``P`` the identity on a block without one). Then a head's write is

- *frozen* (the decompositions: direct logit attribution, second order, the certificate's ``heads``):
  ``P``'s scale held at its value on the run, ``s = s(r)``, so ``P`` is affine and the heads' writes
  ``P_lin(z_h W_O^h) = gain * c(z_h W_O^h) / s``, with the bias part ``gain * c(b_O) / s + bias``, sum to
  ``P(r)`` exactly (the convention of the final norm);
- *linearised* (the gradient methods): a change ``d_h`` of the head's ``z`` writes ``J_P(r) (d_h W_O^h)``,
  the real norm's Jacobian at the run's ``r`` (so a head's edges sum to its node attribution, which
  differentiates through the real norm);
- *patched* (path patching, circuits): ``P(r + d_h W_O^h) - P(r)``, the change in what the sublayer adds
  to the stream when only that head is patched (nonlinear: such changes do not add up over heads).

On a block without a post-norm the three are ``z_h W_O^h`` and ``d_h W_O^h``. An MLP is one sender: its
write is what enters the stream (``hook_mlp_out``, after its post-norm) under every convention.

>>> from rs_interp.models import make_attn_only
>>> model = make_attn_only(1, normalization_type="LN")
>>> z = torch.randn(1, 3, model.cfg.n_heads, model.cfg.d_head, generator=torch.Generator().manual_seed(0))
>>> heads, bias = frozen_heads(model, 0, z, torch.float64)  # no post-norm here: z W_O per head, and b_O
>>> bool(torch.allclose(heads.sum(0) + bias, raw_output(model, 0, z, torch.float64)))
True
"""

from __future__ import annotations

import torch

from .._backend import Model, attn_weight, post_norms
from .norm import Norm

__all__ = ["frozen_heads", "frozen_changes", "linearised_heads", "patched_heads", "raw_output", "attn_post",
           "attn_frozen"]


def attn_post(model: Model, layer: int, dt: torch.dtype) -> Norm:
    """Layer ``layer``'s norm after the attention in ``dt`` (the identity where it has none)."""
    return post_norms(model, layer)[0].to(dt)


def raw_output(model: Model, layer: int, z: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """``r = sum_h z_h W_O^h + b_O`` (batch, pos, d_model) in ``dt``: the attention's output before its post-norm."""
    attn = model.blocks[layer].attn
    W_O = attn.W_O.detach().to(dt)
    return torch.einsum("bphd,hdm->bpm", z.to(dt), W_O) + attn_weight(attn, "b_O", model.cfg.n_heads).detach().to(dt)


def attn_frozen(model: Model, layer: int, z: torch.Tensor, dt: torch.dtype) -> tuple[Norm, torch.Tensor]:
    """The post-attention norm in ``dt`` and its scale on the run whose heads output ``z``, (batch, pos, 1)."""
    post = attn_post(model, layer, dt)
    return post, post.scale(raw_output(model, layer, z, dt))


def frozen_heads(model: Model, layer: int, z: torch.Tensor, dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's frozen write (head, batch, pos, d_model) and the bias part (batch, pos, d_model), in ``dt``:
    they sum to what the attention adds to the stream (module docstring)."""
    attn = model.blocks[layer].attn
    post, scale = attn_frozen(model, layer, z, dt)
    per_head = torch.einsum("bphd,hdm->hbpm", z.to(dt), attn.W_O.detach().to(dt))
    b_O = attn_weight(attn, "b_O", model.cfg.n_heads).detach().to(dt)
    bias = post.linear(b_O.expand(*z.shape[:2], -1), scale)
    if post.bias is not None:
        bias = bias + post.bias
    return post.linear(per_head, scale), bias


def frozen_changes(model: Model, layer: int, z: torch.Tensor, delta: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """(head, batch, pos, d_model): each head's change ``delta`` (batch, pos, head, d_head) of its output as the
    frozen convention writes it, ``P_lin(delta_h W_O^h) = gain * c(delta_h W_O^h) / s``, ``s`` the post-norm's scale on
    the run whose heads output ``z`` (relevance patching's convention: the norm's scale held at the run's)."""
    post, scale = attn_frozen(model, layer, z, dt)
    moved = torch.einsum("bphd,hdm->hbpm", delta.to(dt), model.blocks[layer].attn.W_O.detach().to(dt))
    return moved if post.kind is None else post.linear(moved, scale)


def linearised_heads(model: Model, layer: int, z: torch.Tensor, delta: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """(head, batch, pos, d_model): each head's change ``delta`` (batch, pos, head, d_head) of its output, as
    it enters the stream to first order: ``J_P(r) (delta_h W_O^h)``, ``r`` the raw output of the run whose
    heads output ``z``."""
    post = attn_post(model, layer, dt)
    moved = torch.einsum("bphd,hdm->hbpm", delta.to(dt), model.blocks[layer].attn.W_O.detach().to(dt))
    return moved if post.kind is None else post.jvp(moved, raw_output(model, layer, z, dt))


def patched_heads(model: Model, layer: int, z: torch.Tensor, delta: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """(head, batch, pos, d_model): the change in what the attention adds to the stream when only head ``h``'s
    output moves by ``delta_h``: ``P(r + delta_h W_O^h) - P(r)``, exactly (the real norm)."""
    post = attn_post(model, layer, dt)
    moved = torch.einsum("bphd,hdm->hbpm", delta.to(dt), model.blocks[layer].attn.W_O.detach().to(dt))
    if post.kind is None:
        return moved
    r = raw_output(model, layer, z, dt)
    return post.apply(r + moved) - post.apply(r)
