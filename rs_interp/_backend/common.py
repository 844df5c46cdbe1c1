"""What both TransformerLens versions share: the version, the portable config fields, small helpers.

Nothing here branches on the version; :mod:`.tl3` and :mod:`.tl4` import from it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from typing import Any, Iterator

import torch

from .. import _names as N

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
    l = N.layer_of(name) if isinstance(name, str) else None
    for x in "qkv" if l is not None else "":
        if name in (N.qkv_input(l, x), N.in_block(l, f"attn.hook_{x}_input")):  # the second: 4.x bridge's own point
            return l, x
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



#: The attention weights a grouped-query model holds once per key/value head.
KV_WEIGHTS = ("W_K", "W_V", "b_K", "b_V")


def kv_groups(cfg: Any) -> int:
    """The number of key/value heads: ``n_key_value_heads`` for grouped-query attention, else ``n_heads``.

    Raises:
        ValueError: ``n_heads`` is not a multiple of ``n_key_value_heads``.
    """
    n = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    if cfg.n_heads % n:
        raise ValueError(f"grouped-query attention: n_heads={cfg.n_heads} is not a multiple of n_key_value_heads={n}")
    return n


def per_query_head(w: torch.Tensor, n_heads: int, axis: int) -> torch.Tensor:
    """``w`` with one entry per query head along ``axis``: under grouped-query attention the key/value
    weights (one per KV head) repeated over the query heads that share them, as HookedTransformer's
    ``W_K``/``W_V`` properties do (query head ``h`` reads KV head ``h // (n_heads // n_kv)``).

    >>> per_query_head(torch.tensor([[1.0], [2.0]]), 4, 0).flatten().tolist()
    [1.0, 1.0, 2.0, 2.0]
    """
    groups = w.shape[axis]
    if groups == n_heads:
        return w
    if n_heads % groups:
        raise ValueError(f"grouped-query attention: {n_heads} query heads do not split into {groups} KV heads")
    return w.repeat_interleave(n_heads // groups, dim=axis)


def logit_softcap(model: Any) -> float | None:
    """The final logit soft-cap ``c`` (logits ``c tanh(l / c)``), or None: ``output_logits_soft_cap``
    where it is positive (Gemma-2's ``final_logit_softcapping``, as both versions convert it)."""
    cap = getattr(model.cfg, "output_logits_soft_cap", None)
    return float(cap) if cap is not None and cap > 0 else None


def norm_kind(center: bool, gain: Any, bias: Any) -> str:
    """The TransformerLens name of a norm: ``"LN"`` (centred, with a gain and maybe a bias),
    ``"LNPre"`` (centred, no gain), ``"RMS"`` (a gain), ``"RMSPre"`` (neither)."""
    if center:
        return "LN" if gain is not None or bias is not None else "LNPre"
    return "RMS" if gain is not None else "RMSPre"


@contextlib.contextmanager
def kept_caches(model: Any) -> Iterator[None]:
    """Every cache a forward pass fills on the model, as found again afterwards, also on errors.

    Workaround: TransformerLens 3.x's attention caches ALiBi's bias on the module (``attn.alibi``,
    ``AbstractAttention.forward``), built for the longest key length run so far, and a shorter run reads its
    last rows: a bias built for another length, constant per query row (the patterns the same to rounding, the
    ``attn_scores`` shifted). A run of ours (the certificate's 8-position probe) would leave a user's model
    computing on another bias than before it. Remove when 3.x is no longer supported (4.x's bridge builds no
    ALiBi model) or when its attention stops keeping the bias between runs.
    """
    saved = [(m, m.__dict__["alibi"]) for m in model.modules() if "alibi" in m.__dict__]
    try:
        yield
    finally:
        for module, bias in saved:
            module.__dict__["alibi"] = bias
