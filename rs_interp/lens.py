"""The logit lens: read the residual stream through the unembedding between layers.

At each reading point (after the embedding, after every block, optionally after every attention
sublayer too) the stream ``x`` is decoded as ``softmax(LN_final(x) W_U + b_U)`` when the model has
a final LayerNorm (each reading point's scale recomputed from ``x`` itself), and as
``softmax(x W_U + b_U)`` otherwise. For the toy models, which have no final LayerNorm, the lens
is the model's own readout; elsewhere it is a heuristic (the tuned lens refines it).

Memory stays bounded: sequences go through the model ``batch_chunk`` at a time and rows are
decoded ``row_chunk`` at a time, so ``(point, batch, pos, d_vocab)`` is never held unless the
caller asks for ``full=True``.

>>> from rs_interp import load_toy_model, induction_batch
>>> b = induction_batch(4, seed=0)
>>> lens = logit_lens(load_toy_model(), b.tokens, targets=b.tokens.roll(-1, 1))
>>> lens.labels, tuple(lens.target_probs.shape)
(('embed', 'L0', 'L1'), (3, 4, 48))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from ._backend import Model

from .hooks import store
from ._exact import compute_dtype
from ._state import preserve_state
from ._validate import check_int_range, check_targets, check_tokens

__all__ = ["LogitLensReadings", "logit_lens", "reading_points"]


@dataclass(frozen=True)
class LogitLensReadings:
    """What the logit lens read at every reading point (the lens itself is :func:`logit_lens`).

    Attributes:
        labels: reading points, ``"embed"``, ``"L0"`` (after block 0), ``"L0 attn"`` (after block
            0's attention, with ``sublayers=True``), ...
        target_probs: (point, batch, pos) probability of ``targets`` (NaN where a target is -1),
            or None without targets.
        top_tokens: (point, batch, pos, top_k) most probable token ids.
        top_probs: (point, batch, pos, top_k) their probabilities.
        entropy: (point, batch, pos) entropy in nats.
        log_probs: (point, batch, pos, d_vocab) full log-distributions, only with ``full=True``.
    """

    labels: tuple[str, ...]
    target_probs: torch.Tensor | None
    top_tokens: torch.Tensor
    top_probs: torch.Tensor
    entropy: torch.Tensor
    log_probs: torch.Tensor | None = None


def reading_points(model: Model, sublayers: bool = False) -> list[tuple[str, str]]:
    """(label, hook name) of every reading point, in order."""
    points = [("embed", "blocks.0.hook_resid_pre")]
    for l in range(model.cfg.n_layers):
        if sublayers and not model.cfg.attn_only:
            points.append((f"L{l} attn", f"blocks.{l}.hook_resid_mid"))
        points.append((f"L{l}", f"blocks.{l}.hook_resid_post"))
    return points


def _decode(model: Model, x: torch.Tensor) -> torch.Tensor:
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)  # recomputes the scale from x: the lens reads each point on its own terms
    return model.unembed(x)


def logit_lens(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    targets: Int[torch.Tensor, "batch pos"] | None = None,
    top_k: int = 5,
    sublayers: bool = False,
    full: bool = False,
    batch_chunk: int = 1,
    row_chunk: int = 256,
) -> LogitLensReadings:
    """Decode the residual stream at every reading point (see the module docstring).

    Args:
        model: any ``Model``.
        tokens: (batch, pos) token ids.
        targets: optional (batch, pos) token ids whose probability to report; -1 marks a
            position to skip (its probability is NaN), e.g. the last position for next tokens.
        top_k: how many top tokens to keep per reading.
        sublayers: also read after each attention sublayer (models with MLPs).
        full: also return every full log-distribution (memory: point x batch x pos x d_vocab).
        batch_chunk, row_chunk: sequences per forward pass, rows per decoding step.

    The last reading point equals the model's own output distribution.
    """
    tokens = check_tokens(model, tokens)
    check_int_range("top_k", top_k, 1, model.cfg.d_vocab)
    check_int_range("batch_chunk", batch_chunk, 1)
    check_int_range("row_chunk", row_chunk, 1)
    if targets is not None:
        if not isinstance(targets, torch.Tensor) or tuple(targets.shape) != tuple(tokens.shape):
            raise ValueError(f"targets must have the shape of tokens {tuple(tokens.shape)}")
        skip = targets == -1
        targets = check_targets(torch.where(skip, torch.zeros_like(targets), targets), tokens, model.cfg.d_vocab)
        targets = torch.where(skip.to(targets.device), -1, targets)
    points = reading_points(model, sublayers)
    B, P = tokens.shape
    n_pts = len(points)
    dt = compute_dtype(model)  # float32 for half-precision models: softmax and entropy need the range
    top_tokens = torch.empty(n_pts, B, P, top_k, dtype=torch.long)
    top_probs = torch.empty(n_pts, B, P, top_k, dtype=dt)
    entropy = torch.empty(n_pts, B, P, dtype=dt)
    target_probs = None if targets is None else torch.full((n_pts, B, P), float("nan"), dtype=dt)
    log_probs = torch.empty(n_pts, B, P, model.cfg.d_vocab, dtype=dt) if full else None
    names = {name for _, name in points}
    with preserve_state(model), torch.no_grad():
        for b0 in range(0, B, batch_chunk):
            box: dict[str, torch.Tensor] = {}
            with model.hooks(fwd_hooks=[(n, store(box, n)) for n in names]):
                model(tokens[b0 : b0 + batch_chunk], return_type=None)
            for i, (_, name) in enumerate(points):
                resid = box.pop(name)
                nb = resid.shape[0]
                flat = resid.reshape(nb * P, -1)
                for r0 in range(0, flat.shape[0], row_chunk):
                    rows = slice(r0, r0 + row_chunk)
                    lp = _decode(model, flat[rows]).to(dt).log_softmax(-1)
                    bi = torch.arange(r0, min(r0 + row_chunk, nb * P))
                    bb, pp = b0 + bi // P, bi % P
                    tp, tt = lp.topk(top_k, dim=-1)
                    top_probs[i, bb, pp], top_tokens[i, bb, pp] = tp.exp().cpu(), tt.cpu()
                    entropy[i, bb, pp] = -(lp.exp() * lp).sum(-1).cpu()
                    if targets is not None:
                        t = targets[bb, pp]
                        ok = t >= 0
                        vals = lp.gather(-1, t.clamp(min=0)[:, None])[:, 0].exp()
                        target_probs[i, bb[ok.cpu()], pp[ok.cpu()]] = vals[ok].cpu()
                    if log_probs is not None:
                        log_probs[i, bb, pp] = lp.cpu()
    return LogitLensReadings(labels=tuple(l for l, _ in points), target_probs=target_probs, top_tokens=top_tokens,
                     top_probs=top_probs, entropy=entropy, log_probs=log_probs)


def __getattr__(name: str):
    if name == "LogitLens":
        import warnings

        warnings.warn("rs_interp.LogitLens is now LogitLensReadings (a record of readings; the lens is logit_lens)",
                      DeprecationWarning, stacklevel=2)
        return LogitLensReadings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
