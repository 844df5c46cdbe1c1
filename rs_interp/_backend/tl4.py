"""What TransformerLens 4.x needs: ``TransformerBridge`` in compatibility mode.

rs_interp's own 4.x models are TransformerLens-native bridges (``boot_native``, no weight processing:
standard and rotary positions only); GPT-2 checkpoints boot the Hugging Face model. Attention is recognised
per layer by type: a layer whose bridge has TransformerLens's split-input fork (the classes
``set_use_split_qkv_input`` accepts) uses it; a layer over ``NativeAttention`` gets the emulations of
:mod:`.emulation`. Its public functions, and the readers it takes from :mod:`._tl4_readers`, are the
backend's contract (:class:`.contract.Backend`), each with a twin in :mod:`.tl3`.
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

from .. import _names as N
from .._norm import Norm
from . import _tl4_readers, emulation
from ._tl4_native import (
    _compatible,
    _load_portable,
    _norms_in_model_dtype,
    _portable_views,
    _refuse_unbuilt,
    _rotary_tables_in_model_dtype,
    _tl3_init,
    has_split_inputs,
    is_native_attention,
)
from ._tl4_readers import mlp_modules, pattern_after_attention, seen_head_inputs, spanning_norms  # noqa: F401
from .common import PORTABLE_FIELDS, TL_VERSION, norm_kind, qkv_input_target, set_flag

NATIVE_POSITIONS = ("standard", "rotary")


# --- attention, per layer -----------------------------------------------------------------------

@contextlib.contextmanager
def per_head_inputs(model: Model, fwd: Sequence[tuple[Any, Callable]]) -> Iterator[list[tuple[Any, Callable]]]:
    """Per-head inputs per layer: TransformerLens's own where the layer has them (the flag set
    through ``set_use_split_qkv_input`` and restored), emulated on native attention.

    Raises:
        ValueError: a hooked layer's attention has neither (named with its class).
    """
    fwd = list(fwd)
    names = [n for n, _ in fwd if isinstance(n, str)]
    names += [n for n in model.hook_dict if any(callable(f) and f(n) for f, _ in fwd)]
    layers = {t[0] for t in map(qkv_input_target, names) if t is not None}
    native = {l for l in layers if _tl4_readers.emulates_inputs(model, l)}  # emulated (:mod:`._tl4_readers`)
    for l in sorted(layers - native):
        if not has_split_inputs(model, l):
            raise ValueError(f"{N.qkv_input(l, 'q')} ... hook_v_input: layer {l}'s attention "
                             f"({type(model.blocks[l].attn).__name__}) has no per-head inputs in TransformerLens "
                             f"{TL_VERSION}, and rs_interp emulates them only on native attention and on separate q, "
                             "k, v "
                             "projections without grouped keys (TransformerLens 3.x converts this architecture with "
                             "them)")
    saved = bool(model.cfg.use_split_qkv_input)
    if layers - native:
        set_flag(model, "use_split_qkv_input", True)
    try:
        norm_of = lambda module: Norm(*norm_affine(model, module))  # noqa: E731
        with emulation.qkv_input_hooks(model, fwd, native, norm_of) as runnable:
            yield runnable
    finally:
        set_flag(model, "use_split_qkv_input", saved)


def score_hooks(model: Model, layer: int, box: dict[str, torch.Tensor], key: str) -> list[tuple[str, Callable]]:
    """``hook_attn_scores`` where it holds the scores; on native attention, their emulation."""
    if not is_native_attention(model, layer):
        def keep(t: torch.Tensor, *, hook: Any) -> None:
            box[key] = t.detach()

        return [(N.scores(layer), keep)]
    rotary = model.cfg.positional_embedding_type == "rotary"
    rotate = (lambda l, x: apply_rotary(model, l, x)) if rotary else (lambda l, x: x)
    return emulation.score_hooks(model, layer, box, key, rotate, attn_scale(model, layer))


def run_from_layer(model: Model, x: torch.Tensor, start: int) -> torch.Tensor:
    """The logits from the stream entering block ``start``: :func:`.emulation.run_from_layer`."""
    return emulation.run_from_layer(model, x, start)


def run_to(model: Model, x: torch.Tensor, stop: int, **kwargs: Any) -> torch.Tensor:
    """The stream before block ``stop``; after the last block through :func:`.emulation.final_stream`."""
    if stop < model.cfg.n_layers:
        return model(x, stop_at_layer=stop, **kwargs)
    return emulation.final_stream(model, x, **kwargs)


def apply_rotary(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The native rotary of layer ``layer`` on ``x`` (batch, pos, head, d_head); a ValueError on a Hugging Face
    module."""
    if not is_native_attention(model, layer):
        raise ValueError(f"layer {layer}'s attention ({type(model.blocks[layer].attn).__name__}) applies its rotary "
                         "inside the Hugging Face "
                         f"module, which TransformerLens {TL_VERSION} does not expose: rotary positions are read on "
                         "native and TransformerLens 3.x models only")
    rotary = model.blocks[layer].attn.original_component.rotary
    y, _ = rotary.apply_rope(x.transpose(1, 2), x.transpose(1, 2))
    return y.transpose(1, 2)


def attn_scale(model: Model, layer: int) -> float:
    """The native attention's ``scale``, else ``sqrt(d_head)``."""
    s = getattr(getattr(model.blocks[layer].attn, "original_component", None), "scale", None)
    return float(s) if s is not None else math.sqrt(model.cfg.d_head)


# --- building -----------------------------------------------------------------------------------

def config_fields() -> frozenset[str]:
    """The field names ``TransformerBridgeConfig`` accepts (its own and the legacy config's)."""
    from transformer_lens.config.transformer_lens_config import TransformerLensConfig

    own = set(inspect.signature(ModelConfig.__init__).parameters) - {"self", "kwargs"}
    return frozenset(own | {f.name for f in dataclasses.fields(TransformerLensConfig)})


def make_config(**fields: Any) -> ModelConfig:
    """A ``TransformerBridgeConfig`` for a native bridge.

    Raises:
        NotImplementedError: a positional scheme the native bridge cannot build (shortformer, alibi); the message says
        to use 3.x.
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
                         f"pairs internally but rs_interp's checkpoints hold the (i, i + d/2) layout; use "
                         "TransformerLens 3.x")
    fields = dict(fields)
    fields.pop("rotary_adjacent_pairs", None)
    if fields.get("act_fn") is None:
        fields["act_fn"] = "gelu_new"  # attention-only models never call it
    _refuse_unbuilt(fields, config_fields())
    return ModelConfig(**fields)


def build_model(cfg: ModelConfig) -> Model:
    """A native ``TransformerBridge`` in compatibility mode, no weight processing, initialised as 3.x would be."""
    cfg = make_config(**{k: getattr(cfg, k) for k in PORTABLE_FIELDS if hasattr(cfg, k)} | {"device": "cpu"})
    with torch.random.fork_rng(devices=[]):  # the native init's draws must not shift the caller's RNG
        model = Model.boot_native(cfg, dtype=cfg.dtype)
    _compatible(model, no_processing=True)
    _rotary_tables_in_model_dtype(model)
    _norms_in_model_dtype(model)
    _tl3_init(model, _portable_views, _load_portable)
    return model


def reinitialise(model: Model) -> None:
    """Draw ``model``'s weights again from the global RNG, as :func:`build_model` does."""
    _tl3_init(model, _portable_views, _load_portable)


# --- the one checkpoint format ------------------------------------------------------------------

def is_hf_booted(model: Model) -> bool:
    """Whether ``model`` wraps a Hugging Face model (``boot_transformers``) rather than TransformerLens-native
    modules."""
    return not is_native_attention(model, 0)


def converted_copy(model: Model, dtype: torch.dtype) -> Model:
    """A deep copy of a Hugging Face-booted bridge in ``dtype`` (TransformerLens cannot rebuild it from its config;
    its capture wiring made anew: :func:`._tl4_readers.deep_copy`)."""
    copy = _tl4_readers.deep_copy(model)
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
    return {k: v.detach().clone().contiguous() for k, v in _portable_views(model).items()}


def load_portable_state(model: Model, state: dict[str, torch.Tensor]) -> None:
    """Load a portable state dict (buffers optional) into the bridge, in place.

    The unembedding bias goes to the bias *buffer* 4.3's ``UnembeddingBridge`` registers on the native head (a
    bias-free ``nn.Linear``, whose forward adds it): the logits are ``x W_U + b_U``, as on 3.x, and ``b_U`` is
    not a parameter (rs_interp's training keeps it frozen: :func:`rs_interp.models.training.trainable_parameters`).

    Raises:
        ValueError: a nonzero gated-MLP bias (4.3's native gated MLPs have none).
    """
    _load_portable(model, state, strict=True)


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
    return out[0] if isinstance(out := model.blocks[layer].attn(x), tuple) else out


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

    Remove when: TransformerLens >= 4.4 (or whichever release first does) reports ``LNPre`` after ``fold_ln``
    (4.3 keeps ``"LN"`` with unit gains and zero biases)."""
    if fold_ln and model.cfg.normalization_type == "LN":
        # every norm the blocks have (OLMo's parameter-free ones have neither gain nor bias)
        norms = [getattr(b, n) for b in model.blocks for n in ("ln1", "ln2") if n in b._modules] + [model.ln_final]
        affine = [norm_affine(model, n) for n in norms]
        if all((g is None or bool((g == 1).all())) and (b is None or not bool(b.any())) for _, g, b, _ in affine):
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
    return _tl4_readers.wire(_folded(model, fold_ln), norm_affine)  # readers outside the receivers routed through them


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
    """The bridge's ``tokenizer`` property (the bridge has no ``set_tokenizer``), normalised and its
    BOS/EOS behaviour recorded on the config as ``boot_transformers`` does (``configure_tokenizer``).

    Remove when: the bridge has a public ``set_tokenizer`` (4.3's ``configure_tokenizer`` is in a private
    module: where it is absent the tokenizer is assigned as given).
    """
    try:
        from transformer_lens.model_bridge.sources._bridge_builder import configure_tokenizer
    except ImportError:
        model.tokenizer = tokenizer
        return
    model.tokenizer = configure_tokenizer(tokenizer, model.cfg)


def model_source(model: Model) -> str:
    """``"booted"`` for a bridge over Hugging Face modules (``boot_transformers``: some steps run in
    float32 whatever the dtype), ``"native"`` for TransformerLens-native modules."""
    return "booted" if is_hf_booted(model) else "native"


def projection_layers(model: Model) -> set[int]:
    """The layers whose ``hook_{q,k,v}`` hold ``ln1(resid_pre) W + b`` per head: TransformerLens-native
    attention (a Hugging Face module's projection may be followed inside by more, e.g. a query norm)."""
    return {l for l in range(model.cfg.n_layers) if is_native_attention(model, l)}


def norm_affine(model: Model,
                norm: torch.nn.Module) -> tuple[str | None, torch.Tensor | None, torch.Tensor | None, float]:
    """``(kind, gain, bias, eps)`` of one of the model's norms as it computes: whether it centres
    (the bridge's ``uses_rms_norm``, or the config's kind on native modules), its gain (``1 + w``
    where the bridge stores the gain as an offset, as Gemma's RMSNorm does; None where it has no
    weight, as OLMo's parameter-free LayerNorm), its bias, and its epsilon (the wrapped module's)."""
    if model.cfg.normalization_type is None:
        return None, None, None, 0.0
    inner = getattr(norm, "original_component", None)
    inner = norm if inner is None else inner
    if hasattr(norm, "uses_rms_norm") and inner is not norm:
        center = not norm.uses_rms_norm
        offset = bool(getattr(norm, "uses_weight_offset", False))
    else:
        center, offset = model.cfg.normalization_type in ("LN", "LNPre"), False
    gain = getattr(inner, "weight", None)
    gain = None if not isinstance(gain, torch.Tensor) else (1.0 + gain if offset else gain)
    bias = getattr(inner, "bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None
    eps = next((float(e) for e in (getattr(inner, n, None) for n in ("eps", "variance_epsilon"))
                if isinstance(e, (int, float))), float(model.cfg.eps))
    return norm_kind(center, gain, bias), gain, bias, eps


@contextlib.contextmanager
def unembed_stored_transposed(model: Model) -> Iterator[None]:
    """Nothing to do: 4.x's unembedding does not copy ``W_U`` per call (3.x's does: :mod:`.tl3`)."""
    yield


def logits_with_grad(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """``model(tokens)``'s logits, with gradients (the bridge's own path)."""
    return model(tokens, return_type="logits")


def is_own_hook(fn: Callable) -> bool:
    """Whether a PyTorch hook is the bridge's, transformers' or :mod:`._tl4_readers`'s own wiring (the first two added
    on
    first use), not a user's: left out of the certificate's key. Remove when: both wire at construction."""
    return getattr(fn, "__module__", "").startswith(_tl4_readers.OWN_HOOK_MODULES)


def post_norm_architectures() -> frozenset[str]:
    """None: 4.x keeps the norms after the sublayers at ``ln1_post``/``ln2_post`` for every family."""
    return frozenset()


def other_version() -> str:
    """What to try when this version cannot load a family: the other version, and how."""
    return ("TransformerLens 3.x (pip install 'transformer-lens>=3.9,<4'; RS_INTERP_TL=3), which converts the weights "
            "into its own modules")
