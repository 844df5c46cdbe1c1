"""First-order direct logit attribution: the metric split over the components that write the
final residual stream, exact with each token's final-norm scale frozen (example: the function's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int
from ._backend import Model, attn_weight

from .hooks import store_matching
from ._exact import (attached_hooks, check_normalization, check_sum, compute_dtype, frozen_norm_readout, metric_of,
                     unembed_direction)
from ._state import preserve_state
from ._validate import check_target_pair, check_tokens
from .heads import head_labels

__all__ = ["DirectLogitAttribution", "direct_logit_attribution"]


@dataclass(frozen=True)
class DirectLogitAttribution:
    """Per-component direct logit attribution with the final LayerNorm scale frozen.

    Attributes:
        labels: ``"embed"``, ``"pos_embed"``, ``"L{l}H{h}"``, ``"attn bias L{l}"``, ``"mlp L{l}"``,
            ``"ln_final bias"``, ``"b_U"`` (those the model has).
        contributions: (component, batch, pos): each component's part of the metric; 0 at the
            positions skipped (target -1).
        clean: (batch, pos) the run's own metric (centered logit of the target, or the logit
            difference); 0 at the skipped positions.

    >>> from rs_interp import SHIPPED_MODELS, next_token_targets
    >>> model = SHIPPED_MODELS["code-2l"].load()  # LayerNorm, MLPs, learned positions: GPT-2's architecture
    >>> tokens = torch.arange(10)[None]
    >>> dla = direct_logit_attribution(model, tokens, targets=next_token_targets(tokens))
    >>> dla.labels[:3], dla.contributions.shape[0] == len(dla.labels), float((dla.total() - dla.clean).abs().max()) < 1e-3
    (('embed', 'pos_embed', 'L0H0'), True, True)
    """

    labels: tuple[str, ...]
    contributions: Float[torch.Tensor, "component batch pos"]
    clean: Float[torch.Tensor, "batch pos"]

    def total(self) -> Float[torch.Tensor, "batch pos"]:
        """The sum over components: ``clean``, exactly (checked at run time)."""
        return self.contributions.sum(0)


def direct_logit_attribution(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"],
    contrast: Int[torch.Tensor, "batch pos"] | None = None,
) -> DirectLogitAttribution:
    """Split the target's centered logit (or ``logit[target] - logit[contrast]``) into components.

    The final residual stream is the sum of what enters at the bottom (the token embedding, plus
    the positional embedding for ``"standard"`` positions only: shortformer, rotary and alibi
    models never add one to the stream), every head's write ``z W_O``, every layer's attention
    output bias and every MLP's output. Each is pushed through the final norm *with each token's
    scale frozen from the forward pass* (LN, LNPre, RMS, RMSPre or none; centering and the gain
    are linear, the division by the scale is not), then through ``W_U``. **This is exact only with
    the scale frozen**: it attributes the logits of the run you made, not of a run without the
    component. The LN bias and ``b_U`` are their own terms. The sum is checked against the run's
    own metric; float16/bfloat16 models are decomposed in float32.

    Args:
        targets: (batch, pos) token ids, -1 to skip a position (e.g. :func:`rs_interp.next_token_targets`):
            every contribution and the metric are 0 there.
        contrast: optional (batch, pos) token ids; the metric is then ``logit[target] - logit[contrast]``.

    Raises:
        ValueError: bad tokens/targets; or the parts do not sum to the run's metric, because a
            hook attached by the caller changed the run (the error names it) or the model has a
            part with no exact split.

    >>> from rs_interp import load_toy_model
    >>> import torch
    >>> from rs_interp import next_token_targets
    >>> toks = torch.randint(0, 256, (1, 10))
    >>> dla = direct_logit_attribution(load_toy_model(), toks, targets=next_token_targets(toks))
    >>> bool(torch.allclose(dla.total(), dla.clean, atol=1e-4)), float(dla.clean[0, -1])
    (True, 0.0)
    """
    check_normalization(model, "direct_logit_attribution")
    tokens = check_tokens(model, tokens)
    targets, contrast, skip = check_target_pair(targets, contrast, tokens, model.cfg.d_vocab)
    cfg, dt = model.cfg, compute_dtype(model)
    user_hooks = attached_hooks(model)
    box: dict[str, torch.Tensor] = {}
    wanted = ("hook_embed", "hook_pos_embed", "attn.hook_z", "hook_mlp_out", "ln_final.hook_scale")
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=store_matching(box, model, lambda n: n.endswith(wanted))):
            logits = model(tokens, return_type="logits").to(dt)
        direction, b_U = unembed_direction(model, targets, contrast, dt)
        kind = cfg.normalization_type
        # The frozen final norm is linear: N(c) . direction = c . g, with g read back through it once
        # (center(w * direction) / scale), so no (component, batch, pos, d_model) stack is built.
        g = frozen_norm_readout(kind, direction, getattr(model.ln_final, "w", None) if kind else None,
                                box.get("ln_final.hook_scale"))
        dot = lambda c: (c.to(dt) * g).sum(-1)  # noqa: E731  (batch, pos)
        labels, out = ["embed"], [dot(box["hook_embed"])]
        if cfg.positional_embedding_type == "standard":
            labels.append("pos_embed")
            out.append(dot(box["hook_pos_embed"]))
        for l in range(cfg.n_layers):
            attn = model.blocks[l].attn
            z = box[f"blocks.{l}.attn.hook_z"].to(dt)
            g_heads = einsum(g, attn.W_O.to(dt), "batch pos d_model, head_index d_head d_model -> batch pos head_index d_head")
            labels += list(head_labels(cfg.n_layers, cfg.n_heads)[l * cfg.n_heads : (l + 1) * cfg.n_heads])
            out.append((z * g_heads).sum(-1).permute(2, 0, 1))  # (head, batch, pos)
            labels.append(f"attn bias L{l}")
            out.append(dot(attn_weight(attn, "b_O", model.cfg.n_heads)))
            if not cfg.attn_only:
                labels.append(f"mlp L{l}")
                out.append(dot(box[f"blocks.{l}.hook_mlp_out"]))
        out = [o if o.ndim == 3 else o[None] for o in out]
        metric = metric_of(logits, targets, contrast)
        if cfg.normalization_type == "LN":
            labels.append("ln_final bias")
            out.append((model.ln_final.b.to(dt) * direction).sum(-1)[None])
        labels.append("b_U")
        out.append(b_U[None])
        contributions = torch.cat(out).masked_fill(skip, 0.0)  # skipped positions: no part, excluded from the check
        metric = metric.masked_fill(skip, 0.0)
    check_sum("direct_logit_attribution", contributions.sum(0), metric, contributions, user_hooks, cfg.dtype)
    return DirectLogitAttribution(labels=tuple(labels), contributions=contributions, clean=metric)
