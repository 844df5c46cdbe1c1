"""First-order direct logit attribution: the metric split over the components that write the
final residual stream, exact with each token's final-norm scale frozen (example: the function's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import einsum
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, attn_weight, model_source
from .._state import preserve_state
from ..exact.certificate import confirm, require
from ..exact.needs import needs
from ..exact.postnorm import attn_frozen, attn_post
from ..exact.readout import compute_dtype, d_vocab_out, final_norm, metric_of, unembed_direction
from ..exact.validate import check_target_pair, check_tokens
from ..hooks import store_matching
from ..labels import bias_label, head_labels, mlp_label
from ..metrics import top_effects

__all__ = ["DirectLogitAttribution", "direct_logit_attribution"]


@dataclass(frozen=True)
class DirectLogitAttribution:
    """Per-component direct logit attribution with the final norm's scale frozen.

    Attributes:
        labels: ``"W_E"`` (the token embedding), ``"W_pos"`` (learned positions), ``"L{l}H{h}"``,
            ``"b_O L{l}"``, ``"MLP{l}"``, ``"ln_final.b"``, ``"b_U"`` (those the model has).
        contributions: (component, batch, pos): each component's part of the metric; 0 at the
            positions skipped (target -1).
        per_position: (batch, pos) the run's own metric at each position (the target's centered logit,
            or the logit difference); 0 at the skipped positions.
        clean: the run's own metric: ``per_position``'s mean over the positions with a target.

    >>> from rs_interp import next_token_targets
    >>> from rs_interp.models import SHIPPED_MODELS
    >>> model = SHIPPED_MODELS["code-2l"].load()  # LayerNorm, MLPs, learned positions: GPT-2's architecture
    >>> tokens = torch.arange(10)[None]
    >>> dla = direct_logit_attribution(model, tokens, targets=next_token_targets(tokens))
    >>> (dla.labels[:3], dla.contributions.shape[0] == len(dla.labels),
    ...  float((dla.total() - dla.per_position).abs().max()) < 1e-3)
    (('W_E', 'W_pos', 'L0H0'), True, True)
    """

    labels: tuple[str, ...]
    contributions: Float[torch.Tensor, "component batch pos"]
    per_position: Float[torch.Tensor, "batch pos"]
    clean: float
    scored: torch.Tensor | None = None

    def total(self) -> Float[torch.Tensor, "batch pos"]:
        """The sum over components: ``per_position``, exactly (checked at run time)."""
        return self.contributions.sum(0)

    def mean(self) -> Float[torch.Tensor, " component"]:
        """Each component's part of ``clean``: its contribution's mean over the positions with a target."""
        mask = torch.ones_like(self.per_position, dtype=torch.bool) if self.scored is None else self.scored
        return self.contributions[:, mask].mean(-1)

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` components with the largest ``|part of clean|`` (:meth:`mean`), with that part."""
        return top_effects(self.labels, self.mean(), k)


@needs("embedding", "stream", "z", "heads", "readout", "vocabulary", refuses=("soft-capped logits",))
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
    are linear, the division by the scale is not), then through ``W_U``. On post-norm blocks (Gemma-2/3,
    OLMo-2) a head's write is ``z W_O`` through the norm after the attention, its scale frozen too
    (:mod:`rs_interp.exact.postnorm`), and the ``b_O`` term is the bias part through it. **This is exact only with
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
    >>> bool(torch.allclose(dla.total(), dla.per_position, atol=1e-4)), float(dla.per_position[0, -1])
    (True, 0.0)
    """
    tokens = check_tokens(model, tokens)
    require(model, "direct_logit_attribution")
    targets, contrast, skip = check_target_pair(targets, contrast, tokens, d_vocab_out(model))
    cfg, dt = model.cfg, compute_dtype(model)
    box: dict[str, torch.Tensor] = {}
    final = N.final_stream(cfg.n_layers)
    wanted = N.every(N.EMBED, N.POS_EMBED, N.z, N.mlp_out, final)
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=store_matching(box, model, wanted)):
            logits = model(tokens, return_type="logits").to(dt)
        direction, b_U = unembed_direction(model, targets, contrast, dt)
        # The frozen final norm is linear: N(c) . direction = c . g, with g read back through it once
        # (center(gain * direction) / scale), so no (component, batch, pos, d_model) stack is built.
        norm, scale = final_norm(model, box[final], dt)
        g = norm.readout(direction, scale)
        dot = lambda c: (c.to(dt) * g).sum(-1)  # noqa: E731  (batch, pos)
        labels, out = ["W_E"], [dot(box[N.EMBED])]
        if cfg.positional_embedding_type == "standard":
            labels.append("W_pos")
            out.append(dot(box[N.POS_EMBED]))
        for l in range(cfg.n_layers):
            attn = model.blocks[l].attn
            z = box[N.z(l)].to(dt)
            # A post-norm block's heads write through its norm after the attention, its scale frozen: g read
            # back through that too (rs_interp.exact.postnorm); its bias joins b_O's term
            post = attn_post(model, l, dt)
            g_l = g if post.kind is None else post.readout(g, attn_frozen(model, l, z, dt)[1])
            g_heads = einsum(g_l, attn.W_O.to(dt),
                             "batch pos d_model, head_index d_head d_model -> batch pos head_index d_head")
            labels += list(head_labels(cfg.n_layers, cfg.n_heads)[l * cfg.n_heads : (l + 1) * cfg.n_heads])
            out.append((z * g_heads).sum(-1).permute(2, 0, 1))  # (head, batch, pos)
            labels.append(bias_label(l))
            out.append((attn_weight(attn, "b_O", model.cfg.n_heads).to(dt) * g_l).sum(-1)
                       + (0.0 if post.bias is None else dot(post.bias)))
            if not cfg.attn_only:
                labels.append(mlp_label(l))
                out.append(dot(box[N.mlp_out(l)]))
        out = [o if o.ndim == 3 else o[None] for o in out]
        metric = metric_of(logits, targets, contrast)
        if norm.bias is not None:
            labels.append("ln_final.b")
            out.append((norm.bias * direction).sum(-1)[None])
        labels.append("b_U")
        out.append(b_U[None])
        contributions = torch.cat(out).masked_fill(skip, 0.0)  # skipped positions: no part, excluded from the check
        metric = metric.masked_fill(skip, 0.0)
    # The identities the certificate measured on its probe, checked again on this batch at no cost.
    confirm("direct_logit_attribution", "readout", contributions.sum(0), metric, contributions, cfg.dtype,
            model_source(model))
    scored = ~skip
    clean = float(metric[scored].mean()) if bool(scored.any()) else 0.0
    return DirectLogitAttribution(labels=tuple(labels), contributions=contributions, per_position=metric, clean=clean,
                                  scored=scored)
