"""TransformerLens hook factories (installed as ``rs_interp.hooks``).

Each factory returns a function ``fn(tensor, *, hook)`` for ``model.hooks(...)`` or
``model.run_with_hooks(...)``, so nothing stays attached after the run, even on exceptions.

A hook sees one layer's activation, so the per-head factories take ``head_indices``: indices of
heads *within that layer* (the ``head_index`` axis). Everywhere else in rs_interp ``heads`` is a
list of ``(layer, head)`` pairs.

>>> import torch
>>> from rs_interp.models import make_attn_only
>>> from rs_interp.hooks import store
>>> model, box = make_attn_only(1), {}
>>> _ = model.run_with_hooks(torch.zeros(1, 4, dtype=torch.long),
...                          fwd_hooks=[("blocks.0.attn.hook_pattern", store(box, "pattern"))])
>>> tuple(box["pattern"].shape)
(1, 2, 4, 4)
"""

from __future__ import annotations

from typing import Any, Callable, MutableMapping, Sequence

import torch
from transformer_lens.hook_points import HookPoint

from .split_qkv import split_qkv_inputs  # per-head q/k/v inputs on both TransformerLens versions

__all__ = ["store", "store_matching", "replace", "replace_heads", "replace_heads_with", "add", "zero_heads",
           "mean_heads", "resample_heads", "split_qkv_inputs"]

HookFn = Callable[..., torch.Tensor | None]


def store(box: MutableMapping[str, torch.Tensor], key: str | None = None) -> HookFn:
    """Record the activation in ``box[key]`` (default: the hook's name) without changing it."""

    def fn(tensor: torch.Tensor, *, hook: HookPoint) -> None:
        box[key or hook.name] = tensor.detach()

    return fn


def store_matching(box: MutableMapping[str, torch.Tensor], model: Any,
                   names: Callable[[str], bool]) -> list[tuple[str, HookFn]]:
    """One :func:`store` per hook point of ``model`` whose name satisfies ``names``, keyed by that name.

    Use it instead of a name filter with ``store(box)``: TransformerLens 4's bridge passes the
    canonical name to a hook (``blocks.0.hook_in`` for ``blocks.0.hook_resid_pre``), so the key
    must be the name asked for.
    """
    return [(name, store(box, name)) for name in model.hook_dict if names(name)]


def replace(value: torch.Tensor) -> HookFn:
    """Replace the whole activation with ``value`` (broadcast to the activation's shape)."""

    def fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        return value.to(tensor.dtype).expand_as(tensor).clone()

    return fn


def replace_heads(value: torch.Tensor, head_indices: Sequence[int] | None = None) -> HookFn:
    """Replace a per-head input ``(batch, pos, head_index, d_model)`` by ``value``.

    ``value`` has shape ``(batch, pos, d_model)`` and goes to every head in ``head_indices``
    (all heads of the layer when ``None``); the other heads keep their input. Use on ``hook_q_input``, ``hook_k_input``
    or ``hook_v_input``, applied with :func:`split_qkv_inputs` (``with split_qkv_inputs(model,
    [("blocks.1.hook_k_input", replace_heads(x0))]): model(tokens)``), which makes those hooks
    fire on both TransformerLens versions, native 4.x models included.
    """
    return replace_heads_with(lambda _: value, head_indices)


def replace_heads_with(make: Callable[[torch.Tensor], torch.Tensor],
                       head_indices: Sequence[int] | None = None) -> HookFn:
    """Like :func:`replace_heads`, with the value computed at hook time by ``make(tensor)``.

    Computing late lets the value depend on activations recorded earlier in the same pass.
    """

    def fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        if tensor.ndim != 4:
            raise ValueError(f"{hook.name}: expected a per-head input (batch, pos, head_index, d_model), "
                             f"got {tuple(tensor.shape)}")
        value = make(tensor).to(tensor.dtype)
        out = tensor.clone()
        index = slice(None) if head_indices is None else list(head_indices)
        out[:, :, index, :] = value[:, :, None, :]
        return out

    return fn


def add(delta: torch.Tensor) -> HookFn:
    """Add ``delta`` to the activation (e.g. ``c * ones`` to the residual stream)."""

    def fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        return tensor + delta.to(tensor.dtype)

    return fn


def _set_heads(value: torch.Tensor, head_indices: Sequence[int]) -> HookFn:
    """Replace heads ``head_indices`` of a ``hook_z`` activation (batch, pos, head_index, d_head) by the
    same heads of ``value`` (broadcast to the activation's shape)."""
    index = list(head_indices)

    def fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        if tensor.ndim != 4:
            raise ValueError(f"{hook.name}: expected hook_z's (batch, pos, head_index, d_head), "
                             f"got {tuple(tensor.shape)}")
        out = tensor.clone()
        out[:, :, index] = value.to(tensor.dtype).expand_as(tensor)[:, :, index]
        return out

    return fn


def zero_heads(head_indices: Sequence[int]) -> HookFn:
    """Zero ablation at ``blocks.L.attn.hook_z``: heads ``head_indices`` of that layer write nothing
    (their ``z`` is 0, so ``z W_O`` is 0; the layer's ``b_O`` stays).

    >>> import torch
    >>> from rs_interp.models import make_attn_only
    >>> model = make_attn_only(1)
    >>> with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", zero_heads([0, 1]))]):
    ...     out = model(torch.zeros(1, 4, dtype=torch.long))
    >>> bool(torch.allclose(out, model.W_E[0] @ model.W_U + model.b_U))
    True
    """
    return _set_heads(torch.zeros(()), head_indices)


def mean_heads(mean: torch.Tensor, head_indices: Sequence[int]) -> HookFn:
    """Mean ablation at ``hook_z``: heads ``head_indices`` output ``mean[head]`` at every position, with
    ``mean`` of shape (head_index, d_head) (e.g. a reference run's ``z`` averaged over batch and
    positions), or ``mean[pos, head]`` at each position with ``mean`` of shape (pos, head_index,
    d_head) (averaged over the batch only)."""
    if mean.ndim not in (2, 3):
        raise ValueError("mean must be (head_index, d_head) or (pos, head_index, d_head), "
                         f"got shape {tuple(mean.shape)}")
    return _set_heads(mean[None, None] if mean.ndim == 2 else mean[None], head_indices)


def resample_heads(z_reference: torch.Tensor, head_indices: Sequence[int]) -> HookFn:
    """Resample ablation at ``hook_z``: heads ``head_indices`` output their ``z`` from a reference run,
    ``z_reference`` of shape (batch, pos, head_index, d_head), the activation's own shape."""
    return _set_heads(z_reference, head_indices)
