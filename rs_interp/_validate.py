"""Input checks shared by the helpers: every failure is a ``ValueError`` naming the argument."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from jaxtyping import Int
from transformer_lens import HookedTransformer

__all__: list[str] = []


def check_int_range(name: str, value: int, low: int, high: int | None = None) -> int:
    """Return ``value`` if ``low <= value (<= high)``; raise ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_layer(model: HookedTransformer, layer: int, name: str = "layer") -> int:
    return check_int_range(name, layer, 0, model.cfg.n_layers - 1)


def check_head(model: HookedTransformer, layer: int, head: int, name: str = "head") -> tuple[int, int]:
    check_layer(model, layer, f"{name} layer")
    check_int_range(f"{name} index", head, 0, model.cfg.n_heads - 1)
    return layer, head


def check_heads(model: HookedTransformer, heads: Iterable[Sequence[int]], name: str) -> list[tuple[int, int]]:
    out = []
    for entry in heads:
        if len(entry) != 2:
            raise ValueError(f"{name} entries must be (layer, head) pairs, got {entry!r}")
        out.append(check_head(model, int(entry[0]), int(entry[1]), name=f"{name} entry {tuple(entry)!r}:"))
    return out


def check_tokens(model: HookedTransformer, tokens: torch.Tensor, name: str = "tokens") -> Int[torch.Tensor, "batch pos"]:
    """Validate a token tensor for ``model``; a 1-D tensor is promoted to a batch of one."""
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype (e.g. torch.long), got {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, pos) or (pos,), got {tuple(tokens.shape)}")
    if tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(tokens.shape)}")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"{name} has {tokens.shape[1]} positions; the model's n_ctx allows at most {model.cfg.n_ctx}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= model.cfg.d_vocab:
        raise ValueError(f"{name} must lie in [0, {model.cfg.d_vocab}) (d_vocab), got values in [{lo}, {hi}]")
    return tokens.long().to(model.cfg.device)


def check_targets(targets: torch.Tensor, tokens: torch.Tensor, d_vocab: int, name: str = "targets") -> torch.Tensor:
    """``targets`` are token ids of shape (batch, pos) matching ``tokens`` (or (pos,) for a batch of one)."""
    if not isinstance(targets, torch.Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer torch.Tensor")
    if targets.ndim == 1 and tokens.shape[0] == 1:
        targets = targets[None]
    if tuple(targets.shape) != tuple(tokens.shape):
        raise ValueError(f"{name} must have the shape of tokens {tuple(tokens.shape)}, got {tuple(targets.shape)}")
    if int(targets.min()) < 0 or int(targets.max()) >= d_vocab:
        raise ValueError(f"{name} must lie in [0, {d_vocab}) (d_vocab)")
    return targets.long().to(tokens.device)
