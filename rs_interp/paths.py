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
    """

    labels: tuple[str, ...]
    contributions: torch.Tensor
    heads: tuple[tuple[tuple[int, int], ...], ...]
    targets: torch.Tensor | None

    def total(self) -> torch.Tensor:
        """The sum over paths: the model's logits (at the targets, if given)."""
        return self.contributions.sum(0)

    def last_layer(self) -> torch.Tensor:
        """(path,) the layer of each path's last head, -1 for paths through no head."""
        return torch.tensor([h[-1][0] if h else -1 for h in self.heads])


def _check_attn_only(model: HookedTransformer, what: str) -> None:
    cfg = model.cfg
    if not cfg.attn_only or cfg.normalization_type is not None:
        raise ValueError(
            f"{what} is exact only for attention-only models without LayerNorm or MLPs "
            f"(this model has attn_only={cfg.attn_only}, normalization_type={cfg.normalization_type!r}); "
            "use rs_interp.direct_logit_attribution, which freezes each token's LayerNorm scale"
        )
    if cfg.positional_embedding_type not in ("rotary", "standard"):
        raise ValueError(f"{what} supports rotary or standard positional embeddings, not {cfg.positional_embedding_type!r}")


def _stream_paths(model: HookedTransformer, tokens: torch.Tensor) -> tuple[list[str], list[tuple], list[torch.Tensor]]:
    """Every path's contribution to the final residual stream, (batch, pos, d_model) each."""
    box: dict[str, torch.Tensor] = {}
    names = lambda n: n == "blocks.0.hook_resid_pre" or n.endswith("attn.hook_pattern")  # noqa: E731
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=[(names, H.store(box))]):
            model(tokens, return_type=None)
        labels, heads, terms = [DIRECT], [()], [box["blocks.0.hook_resid_pre"]]
        for l in range(model.cfg.n_layers):
            attn = model.blocks[l].attn
            pattern = box[f"blocks.{l}.attn.hook_pattern"]  # (batch, head, q, k)
            W_OV = attn.W_V @ attn.W_O  # (head, d_model, d_model)
            new_labels, new_heads, new_terms = [], [], []
            for label, chain, term in zip(labels, heads, terms):
                for h in range(model.cfg.n_heads):
                    new_labels.append(f"{label}>L{l}H{h}" if label != DIRECT else f"L{l}H{h}")
                    new_heads.append(chain + ((l, h),))
                    new_terms.append(pattern[:, h] @ (term @ W_OV[h]))
            # b_V reaches the output as b_V W_O (pattern rows sum to one); with b_O it is a constant write.
            bias = torch.einsum("hd,hdm->m", attn.b_V, attn.W_O) + attn.b_O
            if bool(bias.any()):
                new_labels.append(f"bias L{l}")
                new_heads.append(())
                new_terms.append(bias.expand_as(terms[0]))
            labels, heads, terms = labels + new_labels, heads + new_heads, terms + new_terms
    return labels, heads, terms


def path_expansion(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"] | None = None,
) -> PathExpansion:
    """Theorem 3: the logits as an exact sum over paths (see the module docstring).

    Args:
        model: an attention-only ``HookedTransformer`` (no LayerNorm, no MLP).
        tokens: (batch, pos) token ids.
        targets: optional (batch, pos) token ids; then each path's logit for that token only,
            computed without ever forming the full vocabulary.

    In float64 the sum equals the logits to ~1e-14 (tested to 1e-10).

    Raises:
        ValueError: the model has LayerNorm or MLPs, or tokens/targets are malformed.
    """
    _check_attn_only(model, "path_expansion")
    tokens = check_tokens(model, tokens)
    if targets is not None:
        targets = check_targets(targets, tokens, model.cfg.d_vocab)
    labels, heads, terms = _stream_paths(model, tokens)
    with torch.no_grad():
        stack = torch.stack(terms)  # (path, batch, pos, d_model)
        if targets is None:
            out = stack @ model.W_U
            b_U = model.b_U
        else:
            w = model.W_U.T[targets]  # (batch, pos, d_model)
            out = (stack * w).sum(-1)
            b_U = model.b_U[targets]
        if bool(model.b_U.any()):
            labels.append("b_U")
            heads.append(())
            out = torch.cat([out, b_U.expand_as(out[0])[None]])
    return PathExpansion(labels=tuple(labels), contributions=out, heads=tuple(heads), targets=targets)


@dataclass(frozen=True)
class PathAttribution:
    """Each path's share of the correct token's centered logit at scored positions.

    Attributes:
        labels: path labels (as in :class:`PathExpansion`).
        centered: (path, n_scored) each path's part of ``logit[correct] - mean(logit)``.
        share: (path, n_scored) ``centered / centered.sum(0)``.
        last_layer: (path,) the layer of each path's last head (-1: none).
        top1_without_last_layer: fraction of scored positions where the paths that do not end
            in the last layer alone rank the correct token first.
    """

    labels: tuple[str, ...]
    centered: torch.Tensor
    share: torch.Tensor
    last_layer: torch.Tensor
    top1_without_last_layer: float

    def share_ending_in(self, layer: int) -> torch.Tensor:
        """(n_scored,) the summed share of the paths whose last head is in ``layer``."""
        return self.share[self.last_layer == layer].sum(0)


def path_logit_attribution(model: HookedTransformer, batch: InductionBatch) -> PathAttribution:
    """Split the correct token's centered logit into paths at ``batch``'s scored positions.

    >>> from rs_interp import load_toy_model, induction_batch
    >>> att = path_logit_attribution(load_toy_model(), induction_batch(16, seed=0))
    >>> float(att.share_ending_in(1).median()) > 0.8
    True
    """
    _check_attn_only(model, "path_logit_attribution")
    tokens = check_tokens(model, batch.tokens, "batch.tokens")
    labels, heads, terms = _stream_paths(model, tokens)
    mask = batch.scored.to(tokens.device)
    with torch.no_grad():
        stack = torch.stack(terms)[:, :, :-1][:, mask]  # (path, n, d_model)
        correct = tokens[:, 1:][mask]  # (n,)
        w = model.W_U.T[correct] - model.W_U.mean(1)  # centered unembedding columns, (n, d_model)
        centered = (stack * w).sum(-1)
        last = torch.tensor([h[-1][0] if h else -1 for h in heads], device=stack.device)
        partial = stack[last != model.cfg.n_layers - 1].sum(0) @ model.W_U + model.b_U
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

    The final residual stream is the sum of the embeddings, every head's write ``z W_O``, every
    layer's attention output bias and every MLP's output. Each is pushed through the final
    LayerNorm *with each token's scale frozen from the forward pass* (centering is linear, the
    division by the scale is not), then through ``W_U``. **This is exact only with the scale
    frozen**: it attributes the logits of the run you made, not of a run without the component.
    The LayerNorm bias and ``b_U`` are their own terms; the contributions sum to the metric to
    float rounding (tested to 1e-4 in float32 on GPT-2-shaped models).

    >>> from rs_interp import load_toy_model
    >>> import torch
    >>> toks = torch.randint(0, 256, (1, 10))
    >>> dla = direct_logit_attribution(load_toy_model(), toks, targets=toks)
    >>> bool(torch.allclose(dla.total(), dla.metric, atol=1e-4))
    True
    """
    tokens = check_tokens(model, tokens)
    targets = check_targets(targets, tokens, model.cfg.d_vocab)
    if contrast is not None:
        contrast = check_targets(contrast, tokens, model.cfg.d_vocab, "contrast")
    cfg = model.cfg
    box: dict[str, torch.Tensor] = {}
    wanted = ("hook_embed", "hook_pos_embed", "attn.hook_z", "hook_mlp_out", "ln_final.hook_scale")
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=[(lambda n: n.endswith(wanted), H.store(box))]):
            logits = model(tokens, return_type="logits")
        labels, comps = ["embed"], [box["hook_embed"]]
        if "hook_pos_embed" in box:
            labels.append("pos_embed")
            comps.append(box["hook_pos_embed"])
        for l in range(cfg.n_layers):
            attn = model.blocks[l].attn
            z = box[f"blocks.{l}.attn.hook_z"]
            for h in range(cfg.n_heads):
                labels.append(f"L{l}H{h}")
                comps.append(z[:, :, h] @ attn.W_O[h])
            labels.append(f"attn bias L{l}")
            comps.append(attn.b_O.expand_as(comps[0]))
            if not cfg.attn_only:
                labels.append(f"mlp L{l}")
                comps.append(box[f"blocks.{l}.hook_mlp_out"])
        stack = torch.stack(comps)  # (component, batch, pos, d_model)
        if cfg.normalization_type is not None:
            scale = box["ln_final.hook_scale"]  # (batch, pos, 1), frozen
            stack = (stack - stack.mean(-1, keepdim=True)) / scale
            if cfg.normalization_type == "LN":
                stack = stack * model.ln_final.w
        direction = model.W_U.T[targets]
        if contrast is None:
            direction = direction - model.W_U.mean(1)
            b_U = model.b_U[targets] - model.b_U.mean()
            metric = logits.gather(-1, targets[..., None])[..., 0] - logits.mean(-1)
        else:
            direction = direction - model.W_U.T[contrast]
            b_U = model.b_U[targets] - model.b_U[contrast]
            metric = logits.gather(-1, targets[..., None])[..., 0] - logits.gather(-1, contrast[..., None])[..., 0]
        out = [(stack * direction).sum(-1)]
        if cfg.normalization_type == "LN":
            labels.append("ln_final bias")
            out.append((model.ln_final.b * direction).sum(-1)[None])
        labels.append("b_U")
        out.append(b_U[None])
    return DirectLogitAttribution(labels=tuple(labels), contributions=torch.cat(out), metric=metric)
