"""What TransformerLens 4.x needs: ``TransformerBridge`` in compatibility mode.

rs_interp's own 4.x models are TransformerLens-native bridges (``boot_native``, no weight
processing), which know standard and rotary positions only; GPT-2 checkpoints boot the Hugging Face
model (``boot_transformers``). Attention is recognised per layer by type: a layer whose bridge has
TransformerLens's split-input fork (``JointQKVAttentionBridge``, ``PositionEmbeddingsAttentionBridge``:
the classes ``set_use_split_qkv_input`` accepts) uses it; a layer over ``NativeAttention`` gets the
emulations of :mod:`.emulation`. Every function has a twin in :mod:`.tl3`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch
import transformer_lens.model_bridge.sources.native  # noqa: F401  (attaches boot_native)
from transformer_lens import TransformerBridge as Model
from transformer_lens import TransformerBridgeConfig as ModelConfig
from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge
from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
    PositionEmbeddingsAttentionBridge,
)
from transformer_lens.model_bridge.sources.native.model import NativeAttention

from . import emulation
from .common import _HT_BUFFERS, KV_WEIGHTS, PORTABLE_FIELDS, TL_VERSION, qkv_input_target, set_flag

__all__ = ["Model", "ModelConfig"]

NATIVE_POSITIONS = ("standard", "rotary")

#: The attention bridges whose forward pass has TransformerLens's pre-ln1 split-input fork
#: (what ``TransformerBridge._validate_attention_fork_supported`` accepts).
_FORK_ATTENTION = (JointQKVAttentionBridge, PositionEmbeddingsAttentionBridge)


# --- attention, per layer -----------------------------------------------------------------------

def has_split_inputs(model: Model, layer: int) -> bool:
    """Whether layer ``layer``'s attention bridge has TransformerLens's own ``hook_{q,k,v}_input``."""
    return isinstance(model.blocks[layer].attn, _FORK_ATTENTION)


def is_native_attention(model: Model, layer: int) -> bool:
    """Whether layer ``layer``'s attention is TransformerLens-native (``NativeAttention``, from ``boot_native``)."""
    return isinstance(getattr(model.blocks[layer].attn, "original_component", None), NativeAttention)


@contextlib.contextmanager
def per_head_inputs(model: Model, fwd: Sequence[tuple[Any, Callable]]) -> Iterator[list[tuple[Any, Callable]]]:
    """Per-head inputs per layer: TransformerLens's own where the layer has them (the flag set
    through ``set_use_split_qkv_input`` and restored), emulated on native attention.

    Raises:
        ValueError: a hooked layer's attention has neither (named with its class).
    """
    fwd = list(fwd)
    names = [n for n, _ in fwd if isinstance(n, str)] + [n for n in model.hook_dict if any(callable(f) and f(n) for f, _ in fwd)]
    layers = {t[0] for t in map(qkv_input_target, names) if t is not None}
    native = {l for l in layers if is_native_attention(model, l)}
    for l in sorted(layers - native):
        if not has_split_inputs(model, l):
            raise ValueError(f"blocks.{l}.hook_q_input ... hook_v_input: layer {l}'s attention "
                             f"({type(model.blocks[l].attn).__name__}) has no per-head inputs in TransformerLens "
                             f"{TL_VERSION}, and rs_interp emulates them on native attention only (TransformerLens "
                             "3.x converts this architecture with them)")
    saved = bool(model.cfg.use_split_qkv_input)
    if layers - native:
        set_flag(model, "use_split_qkv_input", True)
    try:
        with emulation.qkv_input_hooks(model, fwd, native) as runnable:
            yield runnable
    finally:
        set_flag(model, "use_split_qkv_input", saved)


def score_hooks(model: Model, layer: int, box: dict[str, torch.Tensor], key: str) -> list[tuple[str, Callable]]:
    """``hook_attn_scores`` where it holds the scores; on native attention, their emulation."""
    if not is_native_attention(model, layer):
        def keep(t: torch.Tensor, *, hook: Any) -> None:
            box[key] = t.detach()

        return [(f"blocks.{layer}.attn.hook_attn_scores", keep)]
    rotary = model.cfg.positional_embedding_type == "rotary"
    rotate = (lambda l, x: apply_rotary(model, l, x)) if rotary else (lambda l, x: x)
    return emulation.score_hooks(model, layer, box, key, rotate, attn_scale(model, layer))


def run_to(model: Model, x: torch.Tensor, stop: int, **kwargs: Any) -> torch.Tensor:
    """The stream before block ``stop``; after the last block through :func:`.emulation.final_stream`."""
    if stop < model.cfg.n_layers:
        return model(x, stop_at_layer=stop, **kwargs)
    return emulation.final_stream(model, x, **kwargs)


def apply_rotary(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The native rotary of layer ``layer`` on ``x`` (batch, pos, head, d_head).

    Raises:
        ValueError: the layer's attention is a Hugging Face module, which applies its rotary inside.
    """
    if not is_native_attention(model, layer):
        raise ValueError(f"layer {layer}'s attention ({type(model.blocks[layer].attn).__name__}) applies its rotary "
                         f"inside the Hugging Face module, which TransformerLens {TL_VERSION} does not expose: rotary "
                         "positions are read on native and TransformerLens 3.x models only")
    rotary = model.blocks[layer].attn.original_component.rotary
    y, _ = rotary.apply_rope(x.transpose(1, 2), x.transpose(1, 2))
    return y.transpose(1, 2)


def attn_scale(model: Model, layer: int) -> float:
    """The native attention's ``scale``, else ``sqrt(d_head)``."""
    scale = getattr(getattr(model.blocks[layer].attn, "original_component", None), "scale", None)
    return float(scale) if scale is not None else math.sqrt(model.cfg.d_head)


# --- building -----------------------------------------------------------------------------------

def config_fields() -> frozenset[str]:
    """The field names ``TransformerBridgeConfig`` accepts (its own and the legacy config's)."""
    from transformer_lens.config.transformer_lens_config import TransformerLensConfig

    own = set(inspect.signature(ModelConfig.__init__).parameters) - {"self", "kwargs"}
    return frozenset(own | {f.name for f in dataclasses.fields(TransformerLensConfig)})


def make_config(**fields: Any) -> ModelConfig:
    """A ``TransformerBridgeConfig`` for a native bridge.

    Raises:
        NotImplementedError: a positional scheme the native bridge cannot build (shortformer,
            alibi); the message says to use 3.x.
        ValueError: ``rotary_adjacent_pairs=True``, or another field that changes the function
            and that the native model does not read (:func:`_refuse_unbuilt`), named.
    """
    pos = fields.get("positional_embedding_type", "standard")
    if pos not in NATIVE_POSITIONS:
        raise NotImplementedError(
            f"positional_embedding_type={pos!r}: TransformerLens {TL_VERSION}'s native models have "
            f"{' and '.join(NATIVE_POSITIONS)} positions only; use TransformerLens 3.x for {pos!r}"
        )
    if fields.get("rotary_adjacent_pairs"):
        raise ValueError(f"rotary_adjacent_pairs=True: TransformerLens {TL_VERSION}'s native models rotate adjacent "
                         f"pairs internally but rs_interp's checkpoints hold the (i, i + d/2) layout; use TransformerLens 3.x")
    fields = dict(fields)
    fields.pop("rotary_adjacent_pairs", None)
    if fields.get("act_fn") is None:
        fields["act_fn"] = "gelu_new"  # attention-only models never call it
    _refuse_unbuilt(fields)
    return ModelConfig(**fields)


def _refuse_unbuilt(fields: dict[str, Any]) -> None:
    """Refuse, by name, a functional field the native model does not read (it reads the portable
    fields only) set to anything but what a config of the same shape holds.

    Raises:
        ValueError: e.g. ``parallel_attn_mlp=True``, ``use_qk_norm=True``.
    """
    from .config import functional_fields

    extra = set(fields) & functional_fields(config_fields()) - set(PORTABLE_FIELDS)
    if not extra:
        return
    base = ModelConfig(**{k: v for k, v in fields.items() if k not in extra})
    bad = {k: fields[k] for k in sorted(extra) if fields[k] != getattr(base, k, None)}
    if bad:
        raise ValueError(f"{', '.join(f'{k}={v!r}' for k, v in bad.items())}: TransformerLens {TL_VERSION}'s native "
                         f"models do not build {'this' if len(bad) == 1 else 'these'} (they would be ignored); "
                         f"use TransformerLens 3.x")


def build_model(cfg: ModelConfig) -> Model:
    """A native ``TransformerBridge`` in compatibility mode with no weight processing, initialised
    as HookedTransformer would be from the same global RNG state (see :func:`_tl3_init`)."""
    cfg = make_config(**{k: getattr(cfg, k) for k in PORTABLE_FIELDS if hasattr(cfg, k)} | {"device": "cpu"})
    with torch.random.fork_rng(devices=[]):  # the native init's draws must not shift the caller's RNG
        model = Model.boot_native(cfg, dtype=cfg.dtype)
    _compatible(model, no_processing=True)
    _rotary_tables_in_model_dtype(model)
    _norms_in_model_dtype(model)
    _tl3_init(model)
    return model


def reinitialise(model: Model) -> None:
    """Draw ``model``'s weights again from the global RNG, as :func:`build_model` does (the same
    state gives the same weights as a fresh build)."""
    _tl3_init(model)


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
        if getattr(module, "use_native_layernorm_autograd", False):
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
        names += [f"blocks.{l}.ln1.{p}" for p in norm]
        if not cfg.attn_only:
            names += [f"blocks.{l}.ln2.{p}" for p in norm]
        names += [f"blocks.{l}.attn.{p}" for p in ("W_Q", "W_O", "b_Q", "b_O", "W_K", "W_V", "b_K", "b_V")]
        if not cfg.attn_only:
            names += [f"blocks.{l}.mlp.{p}" for p in ("W_in", "b_in", "W_out", "b_out")]
    return names + [f"ln_final.{p}" for p in norm] + ["unembed.W_U", "unembed.b_U"]


def _tl3_init(model: Model) -> None:
    """Initialise ``model`` exactly as HookedTransformer's GPT-2 scheme would from the same global
    RNG state: ``N(0, initializer_range)`` for every ``W_*`` in its parameter order, gains one,
    biases zero. A seed then gives the same model under both versions. (Gated MLPs, whose native
    layout differs, keep the native initialisation.)"""
    cfg, state = model.cfg, portable_state(model)
    order = _tl3_order(cfg)
    if cfg.gated_mlp or set(order) != set(state) or cfg.init_mode != "gpt2":
        return
    for name in order:
        leaf = name.rsplit(".", 1)[-1]
        t = state[name]
        if leaf.startswith("W_"):
            state[name] = torch.empty(t.shape, dtype=t.dtype).normal_(0.0, cfg.initializer_range)
        else:
            state[name] = torch.ones_like(t) if leaf == "w" else torch.zeros_like(t)
    load_portable_state(model, state)


# --- the one checkpoint format ------------------------------------------------------------------

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


def is_hf_booted(model: Model) -> bool:
    """Whether ``model`` wraps a Hugging Face model (``boot_transformers``) rather than TransformerLens-native modules."""
    return not is_native_attention(model, 0)


def converted_copy(model: Model, dtype: torch.dtype) -> Model:
    """A deep copy of a Hugging Face-booted bridge in ``dtype`` (TransformerLens cannot rebuild it from its config)."""
    copy = __import__("copy").deepcopy(model)
    with contextlib.redirect_stdout(None):  # 4.3's ``to`` prints the dtype change
        copy.to(dtype)
    copy.cfg.dtype = dtype
    return copy


def portable_state(model: Model) -> dict[str, torch.Tensor]:
    """The bridge's parameters under HookedTransformer's names and shapes.

    Raises:
        ValueError: a Hugging Face-booted bridge other than GPT-2 (its rotary layout, parallel
            blocks and missing biases have no portable form here).
    """
    cfg, out = model.cfg, {}
    if is_hf_booted(model) and getattr(cfg, "architecture", None) != "GPT2LMHeadModel":
        raise ValueError(f"this model is a Hugging Face {getattr(cfg, 'architecture', 'model')} booted by TransformerLens "
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
            out[f"blocks.{l}.attn.{'_' if grouped else ''}{name}"] = t
        for ln in ([] if folded else ["ln1"] + ([] if cfg.attn_only else ["ln2"])):
            out.update(_norm_state(getattr(block, ln), f"blocks.{l}.{ln}"))
        if not cfg.attn_only:
            for name in ("W_in", "b_in", "W_out", "b_out") + (("W_gate",) if cfg.gated_mlp else ()):
                out[f"blocks.{l}.mlp.{name}"] = getattr(block.mlp, name)
    if not folded:  # a folded GPT-2 keeps unit gains and zero biases that LNPre has no place for
        out.update(_norm_state(model.ln_final, "ln_final"))
    out["unembed.W_U"] = model.W_U
    out["unembed.b_U"] = model.b_U
    if bool(model.b_U.ne(0).any()):  # refused here, not when the checkpoint is read back
        raise ValueError(f"the unembedding bias is nonzero (max |b_U| {model.b_U.abs().max().item():.3g}; folding the "
                         f"final LayerNorm's bias puts it there): TransformerLens {TL_VERSION}'s native models, which "
                         "rs_interp's checkpoints build, have none; save it from TransformerLens 3.x, or load it with fold_ln=False")
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def _norm_state(norm: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    inner = getattr(norm, "original_component", norm)
    out = {}
    if getattr(inner, "weight", None) is not None:
        out[f"{prefix}.w"] = inner.weight
    if getattr(inner, "bias", None) is not None:
        out[f"{prefix}.b"] = inner.bias
    return out


def load_portable_state(model: Model, state: dict[str, torch.Tensor]) -> None:
    """Load a portable state dict (buffers optional) into the bridge, in place.

    Raises:
        ValueError: a nonzero unembedding bias (native bridges have none).
    """
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    state = {k: v for k, v in state.items() if not k.endswith(_HT_BUFFERS)}
    b_U = state.pop("unembed.b_U", None)
    if b_U is not None and bool(b_U.ne(0).any()):
        raise ValueError(f"the unembedding bias is nonzero (max |b_U| {b_U.abs().max().item():.3g}); "
                         f"TransformerLens {TL_VERSION}'s native models have none")
    perm = _rotary_perm(model.cfg)
    if perm is not None:
        # (a grouped-query model's keys are named _W_K, _b_K: permuted the same way)
        state = {k: v[..., perm] if k.rsplit(".", 1)[-1].lstrip("_") in ("W_Q", "W_K", "b_Q", "b_K") else v for k, v in state.items()}
    converted = convert_tl_checkpoint(state, model.cfg)
    own = model.state_dict()
    converted = {k: v.to(own[k].dtype) for k, v in converted.items()}
    if "unembed.bias" in own and "unembed.bias" not in converted:
        converted["unembed.bias"] = torch.zeros_like(own["unembed.bias"])
    model.load_state_dict(converted, strict=True)


# --- parameters and modules called directly ----------------------------------------------------

def bias_parameters(model: Model, names: Sequence[str]) -> list[torch.nn.Parameter]:
    """The parameters behind HookedTransformer's bias names, in every layer."""
    out = []
    for block in model.blocks:
        for name in names:
            if name in ("b_V", "b_O", "b_Q", "b_K"):
                out.append(getattr(block.attn, name[-1].lower()).original_component.bias)
    if "b_U" in names:
        bias = getattr(model.unembed.original_component, "bias", None)
        if isinstance(bias, torch.nn.Parameter):
            out.append(bias)
    return out


def attention_output(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The attention bridge called on ``x`` (its output without the pattern)."""
    out = model.blocks[layer].attn(x)
    return out[0] if isinstance(out, tuple) else out


def mlp_out_parameter(model: Model, layer: int) -> torch.nn.Parameter:
    """The parameter behind ``W_out`` (stored transposed: the same entries)."""
    return model.blocks[layer].mlp.out.original_component.weight


def set_unembedding(model: Model, W_U: torch.Tensor) -> None:
    """Copy ``W_U`` (d_model, d_vocab) into the unembedding (stored transposed)."""
    with torch.no_grad():
        model.unembed.original_component.weight.copy_(W_U.T)


# --- GPT-2 --------------------------------------------------------------------------------------

def _folded(model: Model, fold_ln: bool) -> Model:
    """Say ``normalization_type="LNPre"`` after folding, as 3.x does (the forward pass is unchanged).

    Remove when: TransformerLens >= 4.4 (or whichever release first does) reports ``LNPre`` after
    ``fold_ln`` (4.3 keeps ``"LN"`` with unit gains and zero biases).
    """
    if fold_ln and model.cfg.normalization_type == "LN":
        norms = [b.ln1 for b in model.blocks] + [b.ln2 for b in model.blocks if hasattr(b, "ln2")] + [model.ln_final]
        if all(bool((n.w == 1).all()) and not bool(n.b.any()) for n in norms):
            model.cfg.normalization_type = "LNPre"
    return model


def from_hf(source: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
            dtype: torch.dtype) -> Model:
    """``boot_transformers`` on a local Hugging Face directory or a hub name, then TransformerLens's
    processing (``enable_compatibility_mode``)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        model = Model.boot_transformers(str(source), device="cpu", dtype=dtype)
    _compatible(model, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed)
    _norms_in_model_dtype(model)
    return _folded(model, fold_ln)


def gpt2_from_hf_dir(path: str, cfg: ModelConfig, *, fold_ln: bool, center_writing_weights: bool,
                     center_unembed: bool, dtype: torch.dtype) -> Model:
    """``boot_transformers`` on a local directory (:func:`from_hf`)."""
    return from_hf(path, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                   dtype=dtype)


def gpt2_from_hub(name: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
                  dtype: torch.dtype) -> Model:
    """``boot_transformers`` from the hub or cache (:func:`from_hf`)."""
    return from_hf(name, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                   dtype=dtype)


def set_tokenizer(model: Model, tokenizer: Any) -> None:
    """The bridge's ``tokenizer`` property (the bridge has no ``set_tokenizer``)."""
    model.tokenizer = tokenizer

