"""TransformerLens 4.x's native models and attention, read and built: the helpers of :mod:`.tl4` (which
holds the functions :mod:`.tl3` has twins of). Each workaround says when it can go."""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Callable

import torch
from transformer_lens import TransformerBridge as Model
from transformer_lens import TransformerBridgeConfig as ModelConfig
from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge
from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
    PositionEmbeddingsAttentionBridge,
)
from transformer_lens.model_bridge.sources.native.model import NativeAttention

from .. import _names as N
from .._messages import few
from .common import _HT_BUFFERS, KV_WEIGHTS, PORTABLE_FIELDS, TL_VERSION

__all__: list[str] = []


#: The attention bridges whose forward pass has TransformerLens's pre-ln1 split-input fork

#: (what ``TransformerBridge._validate_attention_fork_supported`` accepts).
_FORK_ATTENTION = (JointQKVAttentionBridge, PositionEmbeddingsAttentionBridge)


def _refuse_unbuilt(fields: dict[str, Any], known: frozenset[str]) -> None:
    """Refuse, by name, a functional field the native model does not read (it reads the portable
    fields only) set to anything but what a config of the same shape holds.

    Raises:
        ValueError: e.g. ``parallel_attn_mlp=True``, ``use_qk_norm=True``.
    """
    from .config import functional_fields

    extra = set(fields) & functional_fields(known) - set(PORTABLE_FIELDS)
    if not extra:
        return
    base = ModelConfig(**{k: v for k, v in fields.items() if k not in extra})
    bad = {k: fields[k] for k in sorted(extra) if fields[k] != getattr(base, k, None)}
    if bad:
        raise ValueError(f"{few((f'{k}={v!r}' for k, v in bad.items()), show=str)}: TransformerLens {TL_VERSION}'s "
                         f"native models do not build {'this' if len(bad) == 1 else 'these'} (they would be ignored); "
                         f"use TransformerLens 3.x")


def _compatible(model: Model, **processing: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.enable_compatibility_mode(disable_warnings=True, **processing)


def _norms_in_model_dtype(model: Model) -> None:
    """Switch every norm to the bridge's own Python path, HookedTransformer's formula in the
    model's dtype (``NativeRMSNorm`` computes in float32 whatever the dtype: float64 would not be exact).

    Remove when: TransformerLens >= 4.4 (or whichever release first does) computes
    ``NativeRMSNorm`` in the input's dtype.
    """
    for module in model.modules():
        # The Python path needs the norm's weight: 4.3 raises on a parameter-free LayerNorm (OLMo's),
        # which keeps its own path (Hugging Face's: float32 inside, within the booted tolerance).
        inner = getattr(module, "original_component", None)
        if (getattr(module, "use_native_layernorm_autograd", False)
                and isinstance(getattr(inner, "weight", None), torch.Tensor)):
            module.use_native_layernorm_autograd = False


def _rotary_tables_in_model_dtype(model: Model) -> None:
    """Recompute the native rotary tables as HookedTransformer does, ``pos / base^(i / (r/2))`` in
    float64 for a float64 model, laid out for adjacent pairs.

    Remove when: TransformerLens >= 4.4 (or whichever release first does) builds ``NativeRotary``'s
    ``cos_cached``/``sin_cached`` in the model's dtype (4.3: float32 whatever the dtype).
    """
    cfg = model.cfg
    for module in model.modules():
        if type(module).__name__ != "NativeRotary":
            continue
        r = module.rotary_dim
        high = torch.float64 if cfg.dtype == torch.float64 else torch.float32
        pos = torch.arange(cfg.n_ctx, dtype=high)
        freq = float(cfg.rotary_base) ** (torch.arange(r // 2, dtype=high) / (r / 2))
        angles = (pos[:, None] / freq[None, :]).repeat_interleave(2, dim=-1)
        module.cos_cached = angles.cos().to(cfg.dtype)
        module.sin_cached = angles.sin().to(cfg.dtype)


def _tl3_order(cfg: Any) -> list[str]:
    """HookedTransformer's parameters in its ``named_parameters`` order (the order it initialises them)."""
    norm = {"LN": ["w", "b"], "RMS": ["w"]}.get(cfg.normalization_type, [])
    names = ["embed.W_E"] + (["pos_embed.W_pos"] if cfg.positional_embedding_type == "standard" else [])
    for l in range(cfg.n_layers):
        names += [N.in_block(l, f"ln1.{p}") for p in norm]
        if not cfg.attn_only:
            names += [N.in_block(l, f"ln2.{p}") for p in norm]
        names += [N.in_block(l, f"attn.{p}") for p in ("W_Q", "W_O", "b_Q", "b_O", "W_K", "W_V", "b_K", "b_V")]
        if not cfg.attn_only:
            names += [N.in_block(l, f"mlp.{p}") for p in ("W_in", "b_in", "W_out", "b_out")]
    return names + [f"ln_final.{p}" for p in norm] + ["unembed.W_U", "unembed.b_U"]


def _rotary_perm(cfg: Any) -> torch.Tensor | None:
    """Native dim ``2i`` holds HookedTransformer dim ``i``, ``2i + 1`` holds ``i + r/2`` (first ``r = rotary_dim``).

    The native bridge rotates adjacent pairs, HookedTransformer halves: each head's query and key
    dimensions are permuted on load and save (scores are unchanged by a permutation shared by
    queries and keys).
    """
    if cfg.positional_embedding_type != "rotary":
        return None
    r = cfg.rotary_dim or cfg.d_head
    half = torch.arange(r // 2)
    perm = torch.stack([half, half + r // 2], dim=1).flatten()
    return torch.cat([perm, torch.arange(r, cfg.d_head)])


def _norm_state(norm: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    inner = getattr(norm, "original_component", norm)
    out = {}
    if getattr(inner, "weight", None) is not None:
        out[f"{prefix}.w"] = inner.weight
    if getattr(inner, "bias", None) is not None:
        out[f"{prefix}.b"] = inner.bias
    return out


def has_split_inputs(model: Model, layer: int) -> bool:
    """Whether layer ``layer``'s attention bridge has TransformerLens's own ``hook_{q,k,v}_input``."""
    return isinstance(model.blocks[layer].attn, _FORK_ATTENTION)


def is_native_attention(model: Model, layer: int) -> bool:
    """Whether layer ``layer``'s attention is TransformerLens-native (``NativeAttention``, from ``boot_native``)."""
    return isinstance(getattr(model.blocks[layer].attn, "original_component", None), NativeAttention)


#: Bytes of drawn weights :func:`_tl3_init` gathers before loading them into the bridge.
_INIT_CHUNK = 2**25


def _tl3_init(model: Model, views_of: Callable, load: Callable) -> None:
    """Initialise ``model`` as HookedTransformer's GPT-2 scheme would from the same RNG state (``N(0,
    initializer_range)`` for every ``W_*`` in its order, gains one, biases zero): a seed gives the same
    model under both versions. (Gated MLPs, whose native layout differs, keep the native initialisation.)
    Drawn a block at a time (the embedding, each layer, the unembedding) and loaded in parts of about
    ``_INIT_CHUNK`` bytes: the weights held twice are a part's, not the model's. ``views_of(model)``: the portable
    tensors as views of the
    parameters (their shapes and dtypes); ``load(model, state, strict=False)``: a part loaded, its keys returned."""
    cfg, views = model.cfg, views_of(model)
    order, loaded = _tl3_order(cfg), set()
    if cfg.gated_mlp or set(order) != set(views) or cfg.init_mode != "gpt2":
        return
    state: dict[str, torch.Tensor] = {}
    for _, names in itertools.groupby(order, key=lambda k: k.split(".")[: 2 if k.startswith("blocks.") else 1]):
        for name in names:
            leaf, t = name.rsplit(".", 1)[-1], views[name]
            if leaf.startswith("W_"):
                state[name] = torch.empty(t.shape, dtype=t.dtype).normal_(0.0, cfg.initializer_range)
            else:
                state[name] = torch.ones(t.shape, dtype=t.dtype) if leaf == "w" else torch.zeros(t.shape, dtype=t.dtype)
        # Each load walks the whole bridge (its state_dict and load_state_dict, ~0.1 s on a deep toy model),
        # so blocks are gathered up to _INIT_CHUNK bytes: one load for a small model (a per-block load made
        # the main job's deep-model section 6x slower), a block or so at a time for GPT-2 small.
        if sum(t.numel() * t.element_size() for t in state.values()) >= _INIT_CHUNK:
            loaded |= load(model, state, strict=False)
            state = {}
    if state:
        loaded |= load(model, state, strict=False)
    if set(model.state_dict()) - loaded:
        raise ValueError(f"the initialisation did not reach {few(sorted(set(model.state_dict()) - loaded))}")


def _portable_views(model: Model) -> dict[str, torch.Tensor]:
    """:func:`rs_interp._backend.tl4.portable_state` before its copy: views of the parameters (a permuted copy under
    rotary)."""
    cfg, out = model.cfg, {}
    if not is_native_attention(model, 0) and getattr(cfg, "architecture", None) != "GPT2LMHeadModel":  # HF-booted
        raise ValueError(f"this model is a Hugging Face {getattr(cfg, 'architecture', 'model')} booted by "
                         "TransformerLens "
                         f"{TL_VERSION} (boot_transformers), which rs_interp's checkpoints do not hold (they hold "
                         "TransformerLens-native and HookedTransformer models): load it again from its source with "
                         "rs_interp.load_pretrained, or save it from TransformerLens 3.x")
    folded = cfg.normalization_type in ("LNPre", "RMSPre")
    perm = _rotary_perm(cfg)
    inverse = None if perm is None else torch.argsort(perm)
    out["embed.W_E"] = model.W_E
    if cfg.positional_embedding_type == "standard":
        out["pos_embed.W_pos"] = model.W_pos
    for l, block in enumerate(model.blocks):
        attn = block.attn
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            t = getattr(attn, name)
            if inverse is not None and name in ("W_Q", "W_K", "b_Q", "b_K"):
                t = t[..., inverse]
            # HookedTransformer keeps a grouped-query model's per-KV-head weights as _W_K ... _b_V
            # (W_K is its repeated view): the portable names are those, so checkpoints cross versions.
            grouped = getattr(cfg, "n_key_value_heads", None) and name in KV_WEIGHTS
            out[N.in_block(l, f"attn.{'_' if grouped else ''}{name}")] = t
        for ln in ([] if folded else ["ln1"] + ([] if cfg.attn_only else ["ln2"])):
            out.update(_norm_state(getattr(block, ln), N.in_block(l, ln)))
        if not cfg.attn_only:
            for name in ("W_in", "b_in", "W_out", "b_out") + (("W_gate",) if cfg.gated_mlp else ()):
                t = getattr(block.mlp, name)
                if t is None:  # 4.3's native gated MLP has no biases: HookedTransformer's zeros
                    t = torch.zeros(cfg.d_mlp if name == "b_in" else cfg.d_model, dtype=cfg.dtype)
                out[N.in_block(l, f"mlp.{name}")] = t
    if not folded:  # a folded GPT-2 keeps unit gains and zero biases that LNPre has no place for
        out.update(_norm_state(model.ln_final, "ln_final"))
    out["unembed.W_U"] = model.W_U
    out["unembed.b_U"] = model.b_U  # the native head's bias buffer (:func:`load_portable_state`)
    return out


def _load_portable(model: Model, state: dict[str, torch.Tensor], strict: bool) -> set[str]:
    """:func:`rs_interp._backend.tl4.load_portable_state`; the bridge's keys loaded (``strict=False``: some of the
    parameters, the others kept)."""
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    state = {k: v for k, v in state.items() if not k.endswith(_HT_BUFFERS)}
    gated = getattr(model.cfg, "gated_mlp", False)
    for name in [k for k in state if k.endswith((".mlp.b_in", ".mlp.b_out")) and gated]:
        # 4.3's native gated MLP has no biases (Remove when: a native gated MLP with biases exists)
        if bool(state[name].ne(0).any()):
            raise ValueError(f"{name} is nonzero: TransformerLens {TL_VERSION}'s native gated MLPs have no biases; "
                             "load this checkpoint under TransformerLens 3.x")
        del state[name]
    b_U = state.pop("unembed.b_U", None)
    perm = _rotary_perm(model.cfg)
    if perm is not None:
        # (a grouped-query model's keys are named _W_K, _b_K: permuted the same way)
        state = {k: v[..., perm] if k.rsplit(".", 1)[-1].lstrip("_") in ("W_Q", "W_K", "b_Q", "b_K") else v
                 for k, v in state.items()}
    converted = convert_tl_checkpoint(state, model.cfg)
    own = model.state_dict()
    converted = {k: v.to(own[k].dtype) for k, v in converted.items()}
    if b_U is not None:
        converted["unembed.bias"] = b_U.to(own["unembed.bias"].dtype)
    elif strict and "unembed.bias" in own and "unembed.bias" not in converted:
        converted["unembed.bias"] = torch.zeros_like(own["unembed.bias"])
    unexpected = model.load_state_dict(converted, strict=strict).unexpected_keys
    if unexpected:
        raise ValueError(f"not this model's parameters: {unexpected}")
    return set(converted)
