"""Direct logit attribution over paths on models with LayerNorm and MLPs: source -> head -> logit.

First-order attribution (:func:`rs_interp.direct_logit_attribution`) splits the metric over the
components that write the final stream. The next order splits each head's part over what the head
*read*: with every LayerNorm scale and every attention pattern frozen from the forward pass, head
``(l, h)``'s write at query ``q`` is linear in the stream it reads,

    write_h[q] = sum_k A_h[q, k] (N_l(x_l[k]) W_V^h + b_V^h) W_O^h,    x_l = sum of the sources,

(``N_l`` the head's own LayerNorm with its scale frozen, its bias a term of its own), so its part of
the metric splits exactly over the sources upstream of layer ``l``: the embeddings, every earlier
head, every earlier layer's attention bias and MLP, plus two constant terms of the head's own,
``"ln1.b"`` (``b_ln1 W_V W_O``) and ``"b_V"`` (``b_V W_O``). The contributions of a head's sources
sum to its first-order attribution (checked at run time; tested to 1e-9 in float64). On post-norm
blocks (Gemma-2/3, OLMo-2) every write passes the norm after its sublayer with that norm's scale frozen
too (:mod:`rs_interp.exact.postnorm`): a head's sources are then terms of ``P_lin(write_h)``. On
attention-only models without LayerNorm the head -> head terms are Theorem 3's two-head paths.

How it is computed without a (source x destination x batch x pos x d_model) tensor: the metric's
readout through the final norm is a vector ``g[q]`` per query; through head ``h`` and its frozen
LayerNorm it becomes ``u_h[q] = center(w_ln1 * W_V^h W_O^h g[q])``, and a source's part is
``sum_k A_h[q, k] src[k] . u_h[q] / s_l[k]``: one batched product per layer, sources in chunks.

>>> from rs_interp import load_toy_model, next_token_targets
>>> import torch
>>> toks = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
>>> so = second_order_attribution(load_toy_model(), toks, targets=next_token_targets(toks), positions=[10])
>>> so.sources[:3], tuple(so.contributions.shape)
(('W_E', 'L0H0', 'L0H1'), (8, 4, 1, 1))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from einops import einsum
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, attn_weight, model_source, pre_norm
from .._budget import MEMORY_BUDGET
from .._state import preserve_state
from ..exact.certificate import confirm, require
from ..exact.needs import needs
from ..exact.postnorm import attn_frozen, attn_post, frozen_heads
from ..exact.readout import compute_dtype, d_vocab_out, final_norm, unembed_direction
from ..exact.stream import record
from ..exact.validate import check_int_range, check_positions, check_target_pair, check_tokens
from ..labels import bias_label, head_labels, mlp_label
from ..metrics import top_effects

__all__ = ["SecondOrderAttribution", "second_order_attribution"]


@dataclass(frozen=True)
class SecondOrderAttribution:
    """Each destination head's direct part of the metric, split over the sources it read.

    Attributes:
        sources: ``"W_E"``, ``"W_pos"``, ``"L{l}H{h}"``, ``"b_O L{l}"``, ``"MLP{l}"``, then the
            destination's own constant terms ``"ln1.b"`` (norms with a bias) and ``"b_V"``.
        destinations: every head, ``"L{l}H{h}"``.
        contributions: (source, destination, batch, position); exactly 0 where the source is not
            upstream of the destination, and where the position's target is -1 (skipped).
        first_order: (destination, batch, position) each head's first-order direct attribution (the
            sum over its sources).
        positions: the query positions the last axis indexes.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> so = rs_interp.second_order_attribution(model, a, targets=b, positions=[-1])
        >>> bool((so.contributions.sum(0) - so.first_order).abs().max() < 1e-4)
        True
    """

    sources: tuple[str, ...]
    destinations: tuple[str, ...]
    contributions: Float[torch.Tensor, "source destination batch position"]
    first_order: Float[torch.Tensor, "destination batch position"]
    positions: tuple[int, ...]

    def matrix(self, batch: int = 0, position: int = -1) -> torch.Tensor:
        """(source, destination) contributions at one sequence and one (index into) position."""
        return self.contributions[:, :, batch, position]

    def top(self, k: int = 5) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` (source, destination) pairs with the largest ``|contribution|`` summed over the batch
        and the positions, each ``((source, destination), contribution)``."""
        pairs = tuple((s, d) for s in self.sources for d in self.destinations)
        return top_effects(pairs, self.contributions.sum((2, 3)), k)


@needs("embedding", "stream", "z", "heads", "values", "readout", "vocabulary", refuses=("soft-capped logits",))
def second_order_attribution(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"],
    contrast: Int[torch.Tensor, "batch pos"] | None = None,
    positions: Sequence[int] | None = None,
    memory_budget: int = MEMORY_BUDGET,
) -> SecondOrderAttribution:
    """Split every head's direct logit attribution over its upstream sources (module docstring).

    Args:
        model: any model :func:`~rs_interp.direct_logit_attribution` supports (LN, LNPre, RMS,
            RMSPre or no norm; any positional scheme; with or without MLPs).
        tokens: (batch, pos) token ids.
        targets, contrast: the metric, as in :func:`~rs_interp.direct_logit_attribution` (-1 in
            ``targets`` skips a position: every part is 0 there).
        positions: the query positions to attribute (default: all); e.g. ``[-1]`` for the last.
        memory_budget: bytes for the largest intermediate, (source chunk, batch, head, query, key).

    Raises:
        ValueError: bad tokens, targets or positions; a model with no exact split; or a hook the
            caller attached that changed the run (named).

    Example:
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> so = second_order_attribution(model, a, targets=b, positions=[-1])
        >>> so.destinations[:2], so.contributions.shape[0] == len(so.sources)
        (('L0H0', 'L0H1'), True)
    """
    tokens = check_tokens(model, tokens)
    require(model, "second_order_attribution")
    targets, contrast, skip = check_target_pair(targets, contrast, tokens, d_vocab_out(model))
    P = tokens.shape[1]
    pos = list(range(P)) if positions is None else check_positions(positions, P)
    check_int_range("memory_budget", memory_budget, 1)
    cfg, dt = model.cfg, compute_dtype(model)
    L, n_heads = cfg.n_layers, cfg.n_heads
    wanted = N.every(N.EMBED, N.POS_EMBED, N.z, N.pattern, N.mlp_out, N.resid_pre, N.resid_post)
    with preserve_state(model), torch.no_grad():
        box = record(model, tokens, wanted)  # ends at the last of them
        q = torch.tensor(pos, device=tokens.device)
        direction, _ = unembed_direction(model, targets[:, q], None if contrast is None else contrast[:, q], dt)
        f_norm, f_scale = final_norm(model, box[N.final_stream(L)][:, q], dt)
        g = f_norm.readout(direction, f_scale)  # (batch, Q, d_model)

        # The sources, in the order they enter the stream, and the layer that writes each; their
        # writes in one (source, batch, pos, d_model) tensor, so the sources upstream of a layer
        # are a prefix of it (no per-layer stacking).
        labels, layer_of = ["W_E"], [-1]
        if cfg.positional_embedding_type == "standard":
            labels.append("W_pos"), layer_of.append(-1)
        for l in range(L):
            labels += [*head_labels(L, n_heads)[l * n_heads : (l + 1) * n_heads], bias_label(l)]
            layer_of += [l] * (n_heads + 1)
            if not cfg.attn_only:
                labels.append(mlp_label(l)), layer_of.append(l)
        ln1 = [pre_norm(model, l, "ln1").to(dt) for l in range(L)]
        has_ln1_bias = any(n.bias is not None for n in ln1)
        own = (["ln1.b"] if has_ln1_bias else []) + ["b_V"]
        n_src, B, Q = len(labels), tokens.shape[0], len(pos)
        # Batch first, (batch, source, pos, d_model): a batch row's sources upstream of a layer are one
        # (source * pos, d_model) matrix, multiplied in place (no copy of them per layer).
        terms = torch.empty(B, n_src, P, cfg.d_model, dtype=dt)
        terms[:, 0] = box[N.EMBED]
        i = 1
        if cfg.positional_embedding_type == "standard":
            terms[:, 1], i = box[N.POS_EMBED], 2
        for l in range(L):
            attn = model.blocks[l].attn
            z = box[N.z(l)].to(dt)
            if attn_post(model, l, dt).kind is None:
                terms[:, i : i + n_heads] = torch.matmul(z.transpose(1, 2), attn.W_O.to(dt))  # z W_O, per head
                terms[:, i + n_heads] = attn_weight(attn, "b_O", model.cfg.n_heads).to(dt)
            else:  # post-norm blocks: through the norm after the attention, its scale frozen (rs_interp.exact.postnorm)
                per_head, bias = frozen_heads(model, l, z, dt)
                terms[:, i : i + n_heads] = per_head.transpose(0, 1)
                terms[:, i + n_heads] = bias
            i += n_heads + 1
            if not cfg.attn_only:
                terms[:, i], i = box[N.mlp_out(l)], i + 1
        out = torch.zeros(n_src + len(own), L, n_heads, B, Q, dtype=dt)
        first = torch.empty(L, n_heads, B, Q, dtype=dt)
        elem = torch.finfo(dt).bits // 8
        for l in range(L):
            attn = model.blocks[l].attn
            W_V, W_O = attn_weight(attn, "W_V", n_heads).to(dt), attn.W_O.to(dt)
            A = box[N.pattern(l)].to(dt)[:, :, q]  # (batch, head, Q, key)
            post = attn_post(model, l, dt)  # a post-norm block's heads write through it, its scale frozen
            g_l = g if post.kind is None else post.readout(g, attn_frozen(model, l, box[N.z(l)], dt)[1][:, q])
            u = einsum(g_l, W_O, W_V, "batch query d_model, head_index d_head d_model, head_index d_model_in d_head"
                       " -> batch head_index query d_model_in")  # W_V W_O g, per head
            # The head's own norm, scale frozen: its gain and centering move onto u (its transpose with
            # scale 1), 1/scale onto each key: (S / s) . u = (S . u) / s.
            u = ln1[l].readout(u, torch.ones((), dtype=dt))
            if ln1[l].kind is not None:
                A = A / ln1[l].scale(box[N.resid_pre(l)].to(dt))[..., 0][:, None, None, :]
            n_up = sum(1 for i in range(n_src) if layer_of[i] < l)  # a prefix: sources are in depth order
            chunk = max(1, memory_budget // max(1, B * n_heads * Q * P * elem))
            # T[b, (c, k), (h, q)] = src_c[b, k] . u_h[b, q]: one product per batch row; then the
            # pattern's weights A[b, h, q, k] multiply T in place and the keys are summed.
            u_t = u.reshape(B, n_heads * Q, -1).transpose(1, 2)  # (batch, d_model, head * Q)
            A_t = A.permute(0, 3, 1, 2).reshape(B, 1, P, n_heads * Q)  # (batch, 1, key, head * Q)
            for c0 in range(0, n_up, chunk):
                c1 = min(n_up, c0 + chunk)
                T = torch.bmm(terms[:, c0:c1].reshape(B, (c1 - c0) * P, -1), u_t).view(B, c1 - c0, P, n_heads * Q)
                out[c0:c1, l] = T.mul_(A_t).sum(2).view(B, c1 - c0, n_heads, Q).permute(1, 2, 0, 3)
            # The destination's own constants: pattern rows sum to one, so they pass A unchanged.
            b_V = attn_weight(attn, "b_V", n_heads).to(dt)  # (head, d_head)
            consts = ([(ln1[l].bias if ln1[l].bias is not None else torch.zeros(cfg.d_model, dtype=dt)) @ W_V]
                      if has_ln1_bias else [])
            for j, c in enumerate(consts + [b_V]):
                out[n_src + j, l] = torch.einsum("hd,hdm,bqm->hbq", c, W_O, g_l)
            z = box[N.z(l)].to(dt)[:, q]  # (batch, Q, head, d_head)
            first[l] = torch.einsum("bqhd,hdm,bqm->hbq", z, W_O, g_l)
        out, first = out.flatten(1, 2), first.flatten(0, 1)
        skipped = skip[:, q]  # (batch, Q): skipped positions have no part, and are excluded from the check
        out, first = out.masked_fill(skipped, 0.0), first.masked_fill(skipped, 0.0)
    # Each head's sources sum to its first-order part; and the first-order parts, with the rest of the
    # stream, are the run's metric (checked by direct_logit_attribution's identity in the tests).
    confirm("second_order_attribution", "values", out.sum(0), first, out, cfg.dtype, model_source(model))
    return SecondOrderAttribution(sources=tuple(labels + own), destinations=head_labels(L, n_heads),
                                  contributions=out, first_order=first, positions=tuple(pos))
