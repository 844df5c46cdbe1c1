"""Leave a model as it was found: hooks, config flags, training mode, grad mode; and say once when a model in
training mode has dropout, which every helper turns off (it computes in eval mode)."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any, Callable, Iterator

import torch

from ._backend import Model, set_flag
from ._messages import few

__all__: list[str] = []

#: Said once (Python's default filter shows a warning once per place it is raised from: this module's one line).
DROPOUT_WARNING = ("This model is in training mode and its dropout is active ({where}): rs_interp computes every "
                   "helper in eval mode, dropout off, and restores the mode after, so the numbers are the eval-mode "
                   "model's. Call model.eval() first to silence this; it is said once.")

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
    warn_dropout(model)
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


def warn_dropout(model: Any) -> None:
    """Warn (once: :data:`DROPOUT_WARNING`) when a submodule in training mode would drop activations: a
    ``torch.nn.Dropout`` of ``p > 0``, or an attention module whose ``attention_dropout`` rate is above 0 (Hugging
    Face's attention classes, which a TransformerLens 4 bridge runs, pass it to the attention kernel)."""
    for name, m in model.named_modules():
        rate = m.p if isinstance(m, torch.nn.modules.dropout._DropoutNd) else getattr(m, "attention_dropout", 0.0)
        if m.training and isinstance(rate, float) and rate > 0:
            where = f"{name or 'the model'}, p = {rate:g}"
            warnings.warn(DROPOUT_WARNING.format(where=where), UserWarning, stacklevel=1)
            return


@contextlib.contextmanager
def frozen(model: Model) -> Iterator[None]:
    """The model's parameters without ``requires_grad`` for the block: a backward pass to the stream
    computes the same numbers, and the forward pass saves no layer's input for a weight's gradient
    (GPT-2 small at 32 x 21 tokens: the peak of edge attribution patching 0.2 GB lower)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def outside_inference_mode(fn: Callable) -> Callable:
    """Run ``fn`` with ``torch.inference_mode`` switched off (a notebook's usual wrapper, under which nothing can be
    backpropagated), on normal copies of its tensor arguments (an inference tensor cannot be saved for a backward
    pass); outside inference mode ``fn`` is called as it is. The one copy of this escape in rs_interp."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode(False):
            copy = lambda t: t.clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
            return fn(*[copy(a) for a in args], **{k: copy(v) for k, v in kwargs.items()})

    return wrapper
