"""Leave a model as it was found: hooks, config flags, training mode, grad mode."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ._backend import Model, set_flag
from ._messages import few

__all__: list[str] = []

_FLAGS = ("use_split_qkv_input", "use_attn_result", "use_hook_z", "use_attn_in", "use_hook_mlp_in")


@contextlib.contextmanager
def preserve_state(model: Model, **flags: bool) -> Iterator[Model]:
    """Set the given ``cfg`` flags for the duration, then restore flags, mode and grad mode.

    Hooks added inside ``model.hooks(...)`` are removed by TransformerLens itself; this context
    restores what ``hooks`` does not: config flags flipped for the analysis, the ``training``
    flag of every submodule as found (not one flag for the whole model) and
    ``torch.is_grad_enabled()``, also when the body raises.
    """
    saved = {name: getattr(model.cfg, name) for name in _FLAGS if hasattr(model.cfg, name)}
    unknown = set(flags) - set(saved)
    if unknown:
        raise ValueError(f"unknown cfg flags {few(sorted(unknown))}")
    # Every submodule's own flag: a model in train mode may hold a block in eval mode on purpose.
    modes, grad = [(m, m.training) for m in model.modules()], torch.is_grad_enabled()
    try:
        for name, value in flags.items():
            set_flag(model, name, value)  # through the model's own setter (the bridge's updates cloned configs)
        model.eval()
        yield model
    finally:
        for name, value in saved.items():
            set_flag(model, name, value)
        for module, mode in modes:
            module.training = mode
        torch.set_grad_enabled(grad)
