"""What the exact decompositions share: the compute dtype, the unembedding (the metric's direction, the
readout the lenses and the certificate use), and the frozen final norm."""

from __future__ import annotations

import torch

from .._backend import Model, logit_softcap, norm_of
from .norm import Norm

__all__: list[str] = []


def compute_dtype(model: Model) -> torch.dtype:
    """The dtype the decompositions compute in: the model's, or float32 for float16/bfloat16 models
    (CPU kernels such as QR have no half-precision version, and sums of many half-precision terms
    lose the identities the decompositions promise)."""
    dt = model.cfg.dtype
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def d_vocab_out(model: Model) -> int:
    """How many logits the model outputs (``cfg.d_vocab_out``; ``d_vocab`` where the config says -1)."""
    out = getattr(model.cfg, "d_vocab_out", -1)
    return model.cfg.d_vocab if out in (None, -1) else int(out)


def unembed_bias(model: Model, dt: torch.dtype) -> torch.Tensor | None:
    """``b_U`` in ``dt``, or None where the model has none (a Hugging Face-booted bridge may say None)."""
    b_U = getattr(model, "b_U", None)
    return None if b_U is None else b_U.detach().to(dt)


def readout(model: Model, final: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """``softcap(N_final(final) W_U + b_U)`` in ``dt``, the final norm (:mod:`rs_interp.exact.norm`) with its
    scale computed from each row itself: the model's own readout where the certificate's ``readout``
    holds, and the lenses' reading of any stream.

    >>> from rs_interp.models import make_attn_only
    >>> model = make_attn_only(1)
    >>> tokens = torch.zeros(1, 3, dtype=torch.long)
    >>> _, cache = model.run_with_cache(tokens)
    >>> bool(torch.allclose(readout(model, cache["blocks.0.hook_resid_post"], torch.float32), model(tokens), atol=1e-5))
    True
    """
    logits = final_norm_of(model).to(dt).apply(final.to(dt)) @ model.W_U.detach().to(dt)
    b_U = unembed_bias(model, dt)
    if b_U is not None:
        logits = logits + b_U
    cap = logit_softcap(model)
    return logits if cap is None else cap * torch.tanh(logits / cap)


def unembed_direction(
    model: Model, targets: torch.Tensor, contrast: torch.Tensor | None, dt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The metric's direction in the unembedding space and its ``b_U`` term, (batch, pos, d_model) and
    (batch, pos): the target's centered logit, or ``logit[target] - logit[contrast]``."""
    W_U = model.W_U.detach().to(dt)
    b_U = unembed_bias(model, dt)
    b_U = torch.zeros(W_U.shape[1], dtype=dt, device=W_U.device) if b_U is None else b_U
    if contrast is None:
        return W_U.T[targets] - W_U.mean(1), b_U[targets] - b_U.mean()
    return W_U.T[targets] - W_U.T[contrast], b_U[targets] - b_U[contrast]


def metric_of(logits: torch.Tensor, targets: torch.Tensor, contrast: torch.Tensor | None) -> torch.Tensor:
    """The run's own metric, (batch, pos), from its logits."""
    picked = logits.gather(-1, targets[..., None])[..., 0]
    return picked - (logits.mean(-1) if contrast is None else logits.gather(-1, contrast[..., None])[..., 0])


def final_norm_of(model: Model) -> Norm:
    """The final norm as the model computes it (:func:`rs_interp._backend.norm_of`)."""
    return norm_of(model, getattr(model, "ln_final", None))


def final_norm(model: Model, final: torch.Tensor, dt: torch.dtype) -> tuple[Norm, torch.Tensor]:
    """The final norm in ``dt`` and its scale on the final stream ``final`` (batch, pos, d_model),
    (batch, pos, 1): read from the model (Gemma's ``1 + w`` gain, OLMo's parameter-free LayerNorm); the
    certificate's ``readout`` checks that this is the model's norm."""
    norm = final_norm_of(model).to(dt)
    return norm, norm.scale(final.to(dt))
