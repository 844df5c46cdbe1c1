"""What both TransformerLens versions share: the version, the portable config fields, small helpers.

Nothing here branches on the version; :mod:`.tl3` and :mod:`.tl4` import from it.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import torch

TL_VERSION: str = importlib.metadata.version("transformer-lens")
TL_MAJOR: int = int(TL_VERSION.split(".")[0])

#: The config fields a checkpoint records: what defines the function a model computes, named as
#: both versions name them.
PORTABLE_FIELDS = (
    "n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "d_vocab_out", "n_ctx", "attn_only",
    "normalization_type", "positional_embedding_type", "rotary_dim", "rotary_base", "act_fn", "eps",
    "attention_dir", "gated_mlp", "final_rms", "use_attn_scale", "attn_scale", "dtype", "model_name",
    "original_architecture", "initializer_range", "init_mode", "seed", "default_prepend_bos",
    "output_logits_soft_cap", "attn_scores_soft_cap", "n_key_value_heads",
)

#: The config flags that switch optional hook points on, each with a setter of the same name
#: (``set_use_split_qkv_input`` ...) on HookedTransformer and on TransformerBridge.
HOOK_FLAGS = ("use_split_qkv_input", "use_attn_result", "use_attn_in", "use_hook_mlp_in")

#: HookedTransformer's buffers: rebuilt from the config, never part of a checkpoint.
_HT_BUFFERS = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")

QKV_INPUTS = ("hook_q_input", "hook_k_input", "hook_v_input")


class Stop(Exception):
    """Raised from a hook to end a forward pass once what is wanted has been recorded."""


class HookName:
    """What an emulated hook function receives as ``hook``: its TransformerLens name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"HookName({self.name!r})"


def qkv_input_target(name: Any) -> tuple[int, str] | None:
    """``(layer, "q" | "k" | "v")`` for a hook name ``blocks.L.hook_{q,k,v}_input`` (or 4.x's
    ``blocks.L.attn.hook_{q,k,v}_input``, the point it names), else ``None``.

    >>> qkv_input_target("blocks.3.hook_k_input"), qkv_input_target("blocks.3.attn.hook_k")
    ((3, 'k'), None)
    """
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) == 4 and parts[2] == "attn":
        parts = parts[:2] + parts[3:]
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in QKV_INPUTS:
        return int(parts[1]), parts[2][5]
    return None


def set_flag(model: Any, name: str, value: bool) -> None:
    """Set the hook flag ``name`` through the model's own setter (``model.set_<name>``) where it has
    one: TransformerBridge's setters also update the per-block configs its adapters clone.

    Raises:
        ValueError: ``name`` is not one of :data:`HOOK_FLAGS`.
    """
    if name not in HOOK_FLAGS:
        if hasattr(model.cfg, name):  # a flag without a setter (use_hook_z ...)
            setattr(model.cfg, name, value)
            return
        raise ValueError(f"unknown hook flag {name!r}; known: {HOOK_FLAGS}")
    if bool(getattr(model.cfg, name, False)) == bool(value):
        return
    setter = getattr(model, f"set_{name}", None)
    if setter is None:
        setattr(model.cfg, name, value)
    else:
        setter(value)

