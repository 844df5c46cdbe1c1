"""The key the certificate is cached under: everything that can change a number the model computes.

- every parameter and buffer: its storage, version counter (any in-place change through autograd's
  view bumps it), dtype, device, shape and a content digest (its sum: an in-place change through
  ``.data``, which PyTorch does not count, moves it);
- every module: which it is, its class, its training flag, a ``forward`` replaced on the instance, and
  every PyTorch hook on it (forward, forward-pre, backward, backward-pre; TransformerLens's hooks are
  forward hooks of its hook points, so a hook added with ``model.hooks(...)`` is seen while it is on),
  each by its handle and its function; PyTorch's global module hooks too;
- the config fields that change the function, and the hook flags.

A hook function is keyed by identity: one that changes what it does without being registered again
(it reads outside state) is not seen; ``rs_interp.certify(model, refresh=True)`` measures again.

>>> from rs_interp.models import make_attn_only
>>> model = make_attn_only(1)
>>> key = fingerprint(model)
>>> handle = model.blocks[0].attn.register_forward_hook(lambda module, args, out: None)
>>> fingerprint(model) == key, (handle.remove(), fingerprint(model) == key)[1]
(False, True)
"""

from __future__ import annotations

import torch
from torch.nn.modules import module as _torch_module

from .. import _backend
from .._backend import Model

__all__ = ["fingerprint", "Unfingerprintable"]

HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                 "_global_backward_hooks")


class Unfingerprintable(ValueError):
    """A part of the model the key cannot read (so a cached certificate could not be trusted)."""


def _hooks(holder: object, names: tuple[str, ...]) -> tuple:
    """Every hook of ``holder``'s, by handle and function (TransformerLens 4's own wiring left out:
    :func:`rs_interp._backend.is_own_hook`)."""
    return tuple((name, tuple((k, id(fn)) for k, fn in getattr(holder, name, {}).items()
                              if not _backend.is_own_hook(fn)))
                 for name in names)


def _tensor(name: str, t: torch.Tensor) -> tuple:
    if t.is_meta:
        raise Unfingerprintable(f"{name} is on the meta device (no data)")
    try:
        ptr = t.data_ptr()
        digest = float(t.detach().sum()) if t.is_floating_point() or t.is_complex() else int(t.detach().sum())
    except (RuntimeError, NotImplementedError, TypeError) as err:
        raise Unfingerprintable(f"{name} ({type(t).__name__}, {t.dtype}) cannot be read: {str(err)[:120]}") from err
    return name, ptr, t._version, t.dtype, str(t.device), tuple(t.shape), digest


def fingerprint(model: Model) -> tuple:
    """The key (module docstring).

    Raises:
        Unfingerprintable: a tensor whose storage cannot be read (meta, or a tensor type without a plain storage).
    """
    tensors = tuple(_tensor(n, t) for n, t in (*model.named_parameters(), *model.named_buffers()))
    modules = tuple((id(m), type(m).__name__, m.training, id(m.__dict__.get("forward")), _hooks(m, HOOK_DICTS))
                    for m in model.modules())
    cfg = model.cfg
    fields = tuple((k, repr(getattr(cfg, k, None)))
                   for k in sorted(_backend.functional_fields() | set(_backend.HOOK_FLAGS)))
    return tensors, modules, fields, _hooks(_torch_module, _GLOBAL_HOOKS)
