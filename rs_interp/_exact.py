"""What the exact decompositions share: the compute dtype, the frozen final norm, and the check
that a decomposition really sums to the run it claims to split (user hooks included)."""

from __future__ import annotations

import torch

from ._backend import Model, norm_affine

__all__: list[str] = []

#: The normalizations TransformerLens offers; each has an exact split once its scale is frozen.
NORMALIZATIONS = ("LN", "LNPre", "RMS", "RMSPre", None)

#: Slack of the sum check, in units of machine epsilon (of the coarser of the run's dtype and the
#: compute dtype: a float16 run was rounded in float16 however exactly we split it) times the size
#: of the terms summed (the sum of their magnitudes). Measured gaps: ~1 such unit in float16 and
#: bfloat16, < 10 in float32 and float64; a hook that changes the run moves it by far more (but in
#: bfloat16 the check catches only gross changes).
_EPS_FACTOR = 64


def compute_dtype(model: Model) -> torch.dtype:
    """The dtype the decompositions compute in: the model's, or float32 for float16/bfloat16 models
    (CPU kernels such as QR have no half-precision version, and sums of many half-precision terms
    lose the identities the decompositions promise)."""
    dt = model.cfg.dtype
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def check_normalization(model: Model, what: str) -> None:
    if model.cfg.normalization_type not in NORMALIZATIONS:
        raise ValueError(f"{what}: no exact split is known for normalization_type={model.cfg.normalization_type!r} "
                         f"(supported: {NORMALIZATIONS})")


def attached_hooks(model: Model) -> list[str]:
    """Names of the hook points that carry forward hooks right now (the user's, before ours)."""
    return [name for name, hp in model.hook_dict.items() if hp._forward_hooks]


def check_sum(
    what: str, total: torch.Tensor, target: torch.Tensor, terms: torch.Tensor, user_hooks: list[str], run_dtype: torch.dtype,
    source: str = "native",
) -> None:
    """Raise ``ValueError`` unless ``total`` (the sum of ``terms``) equals ``target`` (the run's own
    value) to rounding: of the coarser of the terms' and the run's dtype, and of float32 for a model
    over Hugging Face modules (``source="booted"``: they compute some steps in float32 whatever the
    dtype). A gap means the run is not the one decomposed: a hook changed it, or the model has a part
    the decomposition does not know."""
    eps = max(torch.finfo(terms.dtype).eps, torch.finfo(run_dtype).eps,
              torch.finfo(torch.float32).eps if source == "booted" else 0.0)
    size = terms.abs().sum(0).amax() + target.abs().amax() + 1.0
    gap = (total - target.to(total.dtype)).abs().amax()
    if bool(gap <= _EPS_FACTOR * eps * size):
        return
    if user_hooks:
        why = (f"the run was changed by the hooks attached at {user_hooks}; the decomposition cannot follow "
               "a changed activation: remove them (model.reset_hooks()) or decompose without them")
    else:
        why = "this model has a part the decomposition does not split (no exact split exists for its config)"
    raise ValueError(f"{what}: the parts sum to a value {float(gap):.3g} away from the run's own output: {why}")


def unembed_direction(
    model: Model, targets: torch.Tensor, contrast: torch.Tensor | None, dt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The metric's direction in the unembedding space and its ``b_U`` term, (batch, pos, d_model) and
    (batch, pos): the target's centered logit, or ``logit[target] - logit[contrast]``."""
    W_U, b_U = model.W_U.to(dt), model.b_U.to(dt)
    if contrast is None:
        return W_U.T[targets] - W_U.mean(1), b_U[targets] - b_U.mean()
    return W_U.T[targets] - W_U.T[contrast], b_U[targets] - b_U[contrast]


def metric_of(logits: torch.Tensor, targets: torch.Tensor, contrast: torch.Tensor | None) -> torch.Tensor:
    """The run's own metric, (batch, pos), from its logits."""
    picked = logits.gather(-1, targets[..., None])[..., 0]
    return picked - (logits.mean(-1) if contrast is None else logits.gather(-1, contrast[..., None])[..., 0])


def frozen_norm_readout(kind: str | None, direction: torch.Tensor, w: torch.Tensor | None, scale: torch.Tensor | None) -> torch.Tensor:
    """The vector ``g`` with ``N(c) . direction = c . g`` for a norm ``N`` with frozen ``scale``
    (centering is a symmetric projection, so it moves onto the direction): ``center(w * d) / s``."""
    if kind is None:
        return direction
    if w is not None:
        direction = direction * w.to(direction.dtype)
    if kind in ("LN", "LNPre"):
        direction = direction - direction.mean(-1, keepdim=True)
    return direction / scale.to(direction.dtype)


def final_norm(model: Model, final: torch.Tensor, dt: torch.dtype) -> tuple[str | None, torch.Tensor | None, torch.Tensor | None,
                                                                         torch.Tensor | None]:
    """``(kind, gain, bias, scale)`` of the final norm on the final stream ``final`` (batch, pos,
    d_model): read from the model (:func:`rs_interp._backend.norm_affine`: Gemma's ``1 + w`` gain, OLMo's
    parameter-free LayerNorm), the scale computed from ``final`` itself, (batch, pos, 1) in ``dt``;
    the certificate's ``readout`` checks that this is the model's norm."""
    if model.cfg.normalization_type is None:
        return None, None, None, None
    kind, gain, bias, eps = norm_affine(model, model.ln_final)
    x = final.to(dt)
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return kind, None if gain is None else gain.detach().to(dt), None if bias is None else bias.detach().to(dt), scale
