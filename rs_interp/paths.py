"""Theorem 3, the exact path expansion of attention-only logits, and direct logit attribution.

For an attention-only model (no LayerNorm, no MLP), with ``A^{lh}`` the attention patterns of
the forward pass,

    x_L W_U = sum over paths of  A^{l_m h_m} ... A^{l_1 h_1} x_0 W_OV^{l_1 h_1} ... W_OV^{l_m h_m} W_U,

a path being the empty path (the direct path ``x_0 W_U``) or a chain of heads with strictly
increasing layers: ``(1 + H)^L`` of them. Biases enter as their own terms (``b_V`` and ``b_O``
as a constant written by each layer, then carried by later heads like ``x_0``; ``b_U`` at the
end), so the contributions always sum to the logits. The expansion is exact *given the
patterns*: it is linear in the values, not in the attention.

For models with LayerNorm and MLPs use :func:`direct_logit_attribution`, which is exact only with
each token's final LayerNorm scale frozen from the forward pass.

>>> from rs_interp import load_toy_model, induction_batch
>>> model = load_toy_model("induction-2l")
>>> tokens = induction_batch(2, seed=0).tokens
>>> pe = path_expansion(model, tokens, targets=tokens)
>>> len(pe.labels), tuple(pe.contributions.shape)
(9, (9, 2, 48))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer

from . import hooks as H
from ._exact import attached_hooks, check_normalization, check_sum, compute_dtype, frozen_final_norm
from ._state import preserve_state
from ._validate import check_targets, check_tokens
from .data import InductionBatch

__all__ = [
    "PathExpansion",
    "path_expansion",
    "PathAttribution",
    "path_logit_attribution",
    "DirectLogitAttribution",
    "direct_logit_attribution",
]

DIRECT = "direct"


@dataclass(frozen=True)
class PathExpansion:
    """Contributions of every path to the logits.

    Attributes:
        labels: one label per path: ``"direct"``, ``"L0H1"``, ``"L0H1>L1H0"``; bias terms
            ``"bias L0"``, ``"bias L0>L1H1"``, ``"b_U"`` appear only when those biases are nonzero.
        contributions: (path, batch, pos, d_vocab), or (path, batch, pos) for the ``targets``.
        heads: per path, the chain of (layer, head) it passes through (empty for direct/biases).
        targets: the target token ids, or None for the full vocabulary.
        layers: per path, the layer that wrote its last term (see :meth:`last_layer`).
    """

    labels: tuple[str, ...]
    contributions: torch.Tensor
    heads: tuple[tuple[tuple[int, int], ...], ...]
    targets: torch.Tensor | None
    layers: tuple[int, ...] = ()

    def total(self) -> torch.Tensor:
        """The sum over paths: the model's logits (at the targets, if given)."""
        return self.contributions.sum(0)

    def last_layer(self) -> torch.Tensor:
        """(path,) the layer that wrote each path's last term: its last head's layer, a bias
        term's own layer (``"bias L0"`` belongs to layer 0), -1 for the direct path and ``b_U``."""
        return torch.tensor(self.layers)


def _check_attn_only(model: HookedTransformer, what: str) -> None:
    cfg = model.cfg
    if not cfg.attn_only or cfg.normalization_type is not None:
        raise ValueError(
            f"{what} is exact only for attention-only models without LayerNorm or MLPs "
            f"(this model has attn_only={cfg.attn_only}, normalization_type={cfg.normalization_type!r}); "
            "use rs_interp.direct_logit_attribution, which freezes each token's LayerNorm scale"
        )


def _stream_paths(
    model: HookedTransformer, tokens: torch.Tensor
) -> tuple[list[str], list[tuple], list[int], list[torch.Tensor], torch.Tensor]:
    """Every path's contribution to the final residual stream, (batch, pos, d_model) each.

    Returns labels, head chains, the layer that last wrote each term (-1: the embedding), the
    terms, and the run's own logits (for the sum check). Works for every positional scheme: the
    patterns are taken from the run, and ``x_0`` is what block 0 reads (with the positional
    embedding only where it enters the stream).
    """
    dt = compute_dtype(model)
    box: dict[str, torch.Tensor] = {}
    names = lambda n: n == "blocks.0.hook_resid_pre" or n.endswith("attn.hook_pattern")  # noqa: E731
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=[(names, H.store(box))]):
            logits = model(tokens, return_type="logits")
        labels, heads, layers, terms = [DIRECT], [()], [-1], [box["blocks.0.hook_resid_pre"].to(dt)]
        for l in range(model.cfg.n_layers):
            attn = model.blocks[l].attn
            pattern = box[f"blocks.{l}.attn.hook_pattern"].to(dt)  # (batch, head, q, k)
            W_O = attn.W_O.to(dt)
            W_OV = attn.W_V.to(dt) @ W_O  # (head, d_model, d_model)
            new: list[tuple[str, tuple, int, torch.Tensor]] = []
            for label, chain, term in zip(labels, heads, terms):
                for h in range(model.cfg.n_heads):
                    new.append((f"{label}>L{l}H{h}" if label != DIRECT else f"L{l}H{h}", chain + ((l, h),), l,
                                pattern[:, h] @ (term @ W_OV[h])))
            # b_V reaches the output as b_V W_O (pattern rows sum to one); with b_O it is a constant
            # written by layer l (so it belongs to layer l), then carried by later heads like x_0.
            bias = torch.einsum("hd,hdm->m", attn.b_V.to(dt), W_O) + attn.b_O.to(dt)
            if bool(bias.any()):
                new.append((f"bias L{l}", (), l, bias.expand_as(terms[0])))
            for label, chain, layer, term in new:
                labels.append(label)
                heads.append(chain)
                layers.append(layer)
                terms.append(term)
    return labels, heads, layers, terms, logits


def path_expansion(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"] | None = None,
) -> PathExpansion:
    """Theorem 3: the logits as an exact sum over paths (see the module docstring).

    Args:
        model: an attention-only ``HookedTransformer`` (no LayerNorm, no MLP), any positional
            scheme (the patterns are the run's).
        tokens: (batch, pos) token ids.
        targets: optional (batch, pos) token ids; then each path's logit for that token only,
            computed without ever forming the full vocabulary.

    In float64 the sum equals the logits to ~1e-14 (tested to 1e-10); float16/bfloat16 models
    are expanded in float32. The sum is checked against the run's own logits.

    Raises:
        ValueError: the model has LayerNorm or MLPs; tokens/targets are malformed; or a hook the
            caller attached changed the run, so no sum of paths equals it (the error names it).
    """
    _check_attn_only(model, "path_expansion")
    tokens = check_tokens(model, tokens)
    if targets is not None:
        targets = check_targets(targets, tokens, model.cfg.d_vocab)
    user_hooks = attached_hooks(model)
    labels, heads, layers, terms, logits = _stream_paths(model, tokens)
    dt = terms[0].dtype
    with torch.no_grad():
        stack = torch.stack(terms)  # (path, batch, pos, d_model)
        W_U, b_U_all = model.W_U.to(dt), model.b_U.to(dt)
        if targets is None:
            out, b_U, run = stack @ W_U, b_U_all, logits
        else:
            out = (stack * W_U.T[targets]).sum(-1)
            b_U, run = b_U_all[targets], logits.gather(-1, targets[..., None])[..., 0]
        if bool(b_U_all.any()):
            labels.append("b_U")
            heads.append(())
            layers.append(-1)
            out = torch.cat([out, b_U.expand_as(out[0])[None]])
    check_sum("path_expansion", out.sum(0), run, out, user_hooks, model.cfg.dtype)
    return PathExpansion(labels=tuple(labels), contributions=out, heads=tuple(heads), targets=targets, layers=tuple(layers))


@dataclass(frozen=True)
class PathAttribution:
    """Each path's share of the correct token's centered logit at scored positions.

    Attributes:
        labels: path labels (as in :class:`PathExpansion`), ``"b_U"`` last when the model has one.
        centered: (path, n_scored) each path's part of ``logit[correct] - mean(logit)``; they sum
            to it exactly, ``b_U``'s part included.
        share: (path, n_scored) ``centered / centered.sum(0)``.
        last_layer: (path,) the layer that wrote each path's last term: its last head's, a bias
            term's own layer, -1 for the direct path and ``b_U``.
        top1_without_last_layer: fraction of scored positions where the paths that do not end
            in the last layer alone rank the correct token first.
    """

    labels: tuple[str, ...]
    centered: torch.Tensor
    share: torch.Tensor
    last_layer: torch.Tensor
    top1_without_last_layer: float

    def share_ending_in(self, layer: int) -> torch.Tensor:
        """(n_scored,) the summed share of the paths whose last term was written by ``layer``."""
        return self.share[self.last_layer == layer].sum(0)


def path_logit_attribution(model: HookedTransformer, batch: InductionBatch) -> PathAttribution:
    """Split the correct token's centered logit into paths at ``batch``'s scored positions.

    Raises:
        ValueError: the model is not attention-only, the batch has no scored position, or a hook
            the caller attached changed the run.

    >>> from rs_interp import load_toy_model, induction_batch
    >>> att = path_logit_attribution(load_toy_model(), induction_batch(16, seed=0))
    >>> float(att.share_ending_in(1).median()) > 0.8
    True
    """
    _check_attn_only(model, "path_logit_attribution")
    tokens = check_tokens(model, batch.tokens, "batch.tokens")
    mask = batch.scored.to(tokens.device)
    if not bool(mask.any()):
        raise ValueError("batch has no scored positions")
    user_hooks = attached_hooks(model)
    labels, heads, layers, terms, logits = _stream_paths(model, tokens)
    dt = terms[0].dtype
    with torch.no_grad():
        stack = torch.stack(terms)[:, :, :-1][:, mask]  # (path, n, d_model)
        correct = tokens[:, 1:][mask]  # (n,)
        W_U, b_U = model.W_U.to(dt), model.b_U.to(dt)
        w = W_U.T[correct] - W_U.mean(1)  # centered unembedding columns, (n, d_model)
        centered = (stack * w).sum(-1)
        last = torch.tensor(layers, device=stack.device)
        if bool(b_U.any()):  # b_U is a term of the logits too: attribute it, so the parts sum exactly
            labels.append("b_U")
            centered = torch.cat([centered, (b_U[correct] - b_U.mean())[None]])
            last = torch.cat([last, last.new_tensor([-1])])
        run = logits[:, :-1][mask].to(dt)
        check_sum("path_logit_attribution", centered.sum(0), run.gather(-1, correct[:, None])[:, 0] - run.mean(-1),
                  centered, user_hooks, model.cfg.dtype)
        partial = stack[last[: len(stack)] != model.cfg.n_layers - 1].sum(0) @ W_U + b_U
        top1 = float((partial.argmax(-1) == correct).float().mean())
    return PathAttribution(labels=tuple(labels), centered=centered, share=centered / centered.sum(0),
                           last_layer=last, top1_without_last_layer=top1)


@dataclass(frozen=True)
class DirectLogitAttribution:
    """Per-component direct logit attribution with the final LayerNorm scale frozen.

    Attributes:
        labels: ``"embed"``, ``"pos_embed"``, ``"L{l}H{h}"``, ``"attn bias L{l}"``, ``"mlp L{l}"``,
            ``"ln_final bias"``, ``"b_U"`` (those the model has).
        contributions: (component, batch, pos): each component's part of the metric.
        metric: (batch, pos) the metric itself (centered logit of the target, or the logit difference).
    """

    labels: tuple[str, ...]
    contributions: torch.Tensor
    metric: torch.Tensor

    def total(self) -> torch.Tensor:
        return self.contributions.sum(0)


def direct_logit_attribution(
    model: HookedTransformer,
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

    Raises:
        ValueError: bad tokens/targets; or the parts do not sum to the run's metric, because a
            hook attached by the caller changed the run (the error names it) or the model has a
            part with no exact split.

    >>> from rs_interp import load_toy_model
    >>> import torch
    >>> toks = torch.randint(0, 256, (1, 10))
    >>> dla = direct_logit_attribution(load_toy_model(), toks, targets=toks)
    >>> bool(torch.allclose(dla.total(), dla.metric, atol=1e-4))
    True
    """
    check_normalization(model, "direct_logit_attribution")
    tokens = check_tokens(model, tokens)
    targets = check_targets(targets, tokens, model.cfg.d_vocab)
    if contrast is not None:
        contrast = check_targets(contrast, tokens, model.cfg.d_vocab, "contrast")
    cfg, dt = model.cfg, compute_dtype(model)
    user_hooks = attached_hooks(model)
    box: dict[str, torch.Tensor] = {}
    wanted = ("hook_embed", "hook_pos_embed", "attn.hook_z", "hook_mlp_out", "ln_final.hook_scale")
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=[(lambda n: n.endswith(wanted), H.store(box))]):
            logits = model(tokens, return_type="logits").to(dt)
        labels, comps = ["embed"], [box["hook_embed"].to(dt)]
        if cfg.positional_embedding_type == "standard":
            labels.append("pos_embed")
            comps.append(box["hook_pos_embed"].to(dt))
        for l in range(cfg.n_layers):
            attn = model.blocks[l].attn
            z = box[f"blocks.{l}.attn.hook_z"].to(dt)
            W_O = attn.W_O.to(dt)
            for h in range(cfg.n_heads):
                labels.append(f"L{l}H{h}")
                comps.append(z[:, :, h] @ W_O[h])
            labels.append(f"attn bias L{l}")
            comps.append(attn.b_O.to(dt).expand_as(comps[0]))
            if not cfg.attn_only:
                labels.append(f"mlp L{l}")
                comps.append(box[f"blocks.{l}.hook_mlp_out"].to(dt))
        stack = frozen_final_norm(model, torch.stack(comps), box.get("ln_final.hook_scale"))  # (component, batch, pos, d_model)
        W_U, b_U_all = model.W_U.to(dt), model.b_U.to(dt)
        direction = W_U.T[targets]
        if contrast is None:
            direction = direction - W_U.mean(1)
            b_U = b_U_all[targets] - b_U_all.mean()
            metric = logits.gather(-1, targets[..., None])[..., 0] - logits.mean(-1)
        else:
            direction = direction - W_U.T[contrast]
            b_U = b_U_all[targets] - b_U_all[contrast]
            metric = logits.gather(-1, targets[..., None])[..., 0] - logits.gather(-1, contrast[..., None])[..., 0]
        out = [(stack * direction).sum(-1)]
        if cfg.normalization_type == "LN":
            labels.append("ln_final bias")
            out.append((model.ln_final.b.to(dt) * direction).sum(-1)[None])
        labels.append("b_U")
        out.append(b_U[None])
        contributions = torch.cat(out)
    check_sum("direct_logit_attribution", contributions.sum(0), metric, contributions, user_hooks, cfg.dtype)
    return DirectLogitAttribution(labels=tuple(labels), contributions=contributions, metric=metric)
