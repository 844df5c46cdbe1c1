"""Every difference between TransformerLens 3.x and 4.x, in one small package.

TransformerLens 3.x builds models as ``HookedTransformer``; 4.0 removed it for
``TransformerBridge``. With ``enable_compatibility_mode`` the bridge has the surface the analyses
use (hook names, ``W_Q`` ... ``W_U``, ``model.hooks``, ``run_with_cache``, ``start_at_layer``), so
the analyses import :data:`Model` and call the few functions here where the two differ.

- :mod:`.common`: what both share (the version, the portable config fields, hook flags set
  through the model's own setters: :func:`set_flag`);
- :mod:`.tl3`: what 3.x needs; :mod:`.tl4`: what 4.x needs, each implementing the declared contract
  (:class:`.contract.Backend`); the installed version's module is chosen once, here;
- :mod:`.emulation`: the hooks 4.3's native attention lacks (per-head q/k/v inputs, attention
  scores, the final stream), each with the condition under which it can be removed.
- :mod:`.head_copies`: a query or key norm spanning the heads (OLMo-2, OLMoE) applied to each head's
  own copy while the per-head inputs are on, so that one head's input moves that head's query alone.

The public face of the per-head inputs is :func:`rs_interp.hooks.split_qkv_inputs`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch

from .._messages import few
from .._norm import IDENTITY, Norm
from . import config as _config
from . import head_copies
from .common import (  # noqa: F401
    _HT_BUFFERS,
    HOOK_FLAGS,
    KV_WEIGHTS,
    PORTABLE_FIELDS,
    TL_MAJOR,
    TL_VERSION,
    Stop,
    kept_caches,
    kv_groups,
    logit_softcap,  # noqa: F401  (the backend's face: the library reads them here)
    per_query_head,
    set_flag,
)
from .contract import Backend

if TL_MAJOR >= 4:
    from . import tl4 as _version
else:
    from . import tl3 as _version
#: The installed version's module, read only through its contract (:class:`.contract.Backend`).
_impl: Backend = _version

__all__ = ["TL_VERSION", "TL_MAJOR", "Model", "ModelConfig", "transformer_lens_version"]

Model = _impl.Model
"""The model every helper takes: ``HookedTransformer`` under TransformerLens 3.x, ``TransformerBridge``
(in compatibility mode) under 4.x; :func:`rs_interp.load_toy_model`, :func:`rs_interp.load_gpt2` and
:func:`rs_interp.load_pretrained` return it.

>>> import rs_interp as ri
>>> isinstance(ri.load_toy_model("induction-2l"), ri.Model)
True
"""
ModelConfig = _impl.ModelConfig
#: Where a gated MLP adds ``b_in``: 3.x's GatedMLP after the product, ``act(x W_gate) * (x W_in) + b_in``; 4.x's
#: modules (native: no bias; Hugging Face's: the up projection's) inside, ``act(x W_gate) * (x W_in + b_in)``.
GATED_B_IN_AFTER_PRODUCT = TL_MAJOR == 3
portable_state = _impl.portable_state
load_portable_state = _impl.load_portable_state
score_hooks = _impl.score_hooks
apply_rotary = _impl.apply_rotary
attn_scale = _impl.attn_scale
bias_parameters = _impl.bias_parameters
attention_output = _impl.attention_output
mlp_out_parameter = _impl.mlp_out_parameter
set_unembedding = _impl.set_unembedding
gpt2_from_hf_dir = _impl.gpt2_from_hf_dir
gpt2_from_hub = _impl.gpt2_from_hub
from_hf = _impl.from_hf
set_tokenizer = _impl.set_tokenizer
build_model = _impl.build_model
reinitialise = _impl.reinitialise
config_fields = _impl.config_fields
model_source = _impl.model_source
norm_affine = _impl.norm_affine
logits_with_grad = _impl.logits_with_grad
unembed_stored_transposed = _impl.unembed_stored_transposed
other_version = _impl.other_version
is_own_hook = _impl.is_own_hook
mlp_modules = _impl.mlp_modules
pattern_after_attention = _impl.pattern_after_attention
spanning_norms = _impl.spanning_norms
seen_head_inputs = _impl.seen_head_inputs


def attn_weight(obj: Any, name: str, n_heads: int) -> torch.Tensor:
    """``obj.<name>`` (``W_Q`` ... ``b_O``, of a model: (layer, head, ...), or of one attention
    module: (head, ...)) with one entry per query head, and zeros for a bias the attention does not have. Under
    grouped-query attention 3.x's
    ``W_K``/``W_V`` are already repeated per query head and 4.x's are per KV head: both come out
    per query head here.

    >>> from rs_interp.models import make_attn_only
    >>> tuple(attn_weight(make_attn_only(1, n_key_value_heads=1), "W_K", 2).shape)
    (1, 2, 32, 16)
    """
    w = getattr(obj, name)
    if w is None and name.startswith("b_"):
        # a Hugging Face-booted bridge of bias-free attention (Llama, GPT-J ...) says None; 3.x holds zeros
        W = getattr(obj, "W_" + name[2:])
        shape = W.shape[:-3] + W.shape[-1:] if name == "b_O" else W.shape[:-2] + W.shape[-1:]
        w = torch.zeros(shape, dtype=W.dtype, device=W.device)
    if name not in KV_WEIGHTS:
        return w
    return per_query_head(w, n_heads, -3 if name.startswith("W_") else -2)


@contextlib.contextmanager
def per_head_inputs(model: Model, fwd: Sequence[tuple[Any, Callable]]) -> Iterator[list[tuple[Any, Callable]]]:
    """Per-head query, key and value inputs (``blocks.L.hook_{q,k,v}_input``) for the block: the version's
    (TransformerLens's own where the layer has them, switched on and restored; emulated on 4.x's native
    attention), with a query or key norm spanning the heads (OLMo-2's, OLMoE's) applied to each head's own copy
    (:mod:`.head_copies`). Yields ``fwd`` ready for ``model.hooks``.

    Raises:
        ValueError: on 4.x, a hooked layer's attention has no per-head inputs and none are emulated (named).
    """
    with _impl.per_head_inputs(model, fwd) as runnable, \
            head_copies.per_head_copies(spanning_norms(model), lambda box: seen_head_inputs(model, box)):
        yield runnable


def has_qk_norm(model: Model) -> bool:
    """Whether each head normalises its queries and keys before the score: ``use_qk_norm``, or a
    Hugging Face attention with ``q_norm`` (Qwen3, OLMo-2 ... booted on 4.x, whose config does not say)."""
    return bool(getattr(model.cfg, "use_qk_norm", False)) or any(
        hasattr(getattr(block.attn, "original_component", None), "q_norm") for block in model.blocks)


def qk_norm_spans_heads(model: Model) -> bool:
    """Whether a query or key norm normalises across the heads (OLMo-2's and OLMoE's ``q_norm``/``k_norm`` over
    all ``n_heads * d_head`` dimensions, on either version), after ``hook_q``/``hook_k``: patching one head's
    ``hook_q`` then moves every head's normalised query. The per-head inputs apply such a norm to each head's
    own copy (:mod:`.head_copies`), so moving one head's input moves that head's query alone."""
    return bool(spanning_norms(model))


def projection_layers(model: Model) -> set[int]:
    """The layers whose ``hook_{q,k,v}`` hold ``ln1(resid_pre) W + b`` per head and are read so (a gradient there
    taken back through ``W`` by hand, a head's moved input projected there): the version's, less the layers with a
    query or key norm spanning the heads after ``hook_q``/``hook_k`` (a head's input then reaches every head's
    query through the norm: those layers are read through their per-head inputs, :mod:`.head_copies`)."""
    return _impl.projection_layers(model) - {n.layer for n in spanning_norms(model)}


def norm_of(model: Model, module: torch.nn.Module | None) -> Norm:
    """One of the model's norms as it computes (:class:`rs_interp.exact.norm.Norm`: its kind, the gain it
    applies, its bias and epsilon, read by :func:`norm_affine`); the identity where the model has none.

    Raises:
        ValueError: the config says the model normalises, but ``module`` is None.

    >>> from rs_interp.models import make_attn_only
    >>> model = make_attn_only(1, normalization_type="LN")
    >>> norm_of(model, model.blocks[0].ln1).kind, norm_of(make_attn_only(1), None).kind
    ('LN', None)
    """
    if model.cfg.normalization_type is None:
        return IDENTITY
    if module is None:
        raise ValueError(f"the config says normalization_type={model.cfg.normalization_type!r}, but the model has no "
                         "such norm here")
    return Norm(*norm_affine(model, module))


def transformer_lens_version() -> str:
    """The TransformerLens version rs_interp runs on, e.g. ``"3.9.0"`` or ``"4.3.0"``."""
    return TL_VERSION


def is_model(obj: Any) -> bool:
    """Whether ``obj`` is a model of the installed TransformerLens (HookedTransformer or bridge)."""
    return isinstance(obj, Model)


def make_config(**fields: Any) -> ModelConfig:
    """A config of the installed version from HookedTransformerConfig-style fields.

    Raises:
        NotImplementedError: on 4.x, a positional scheme the native bridge cannot build
            (shortformer, alibi); the message says to use 3.x.
        ValueError: a field the installed version does not know.
    """
    unknown = set(fields) - config_fields()
    if unknown:
        raise ValueError(f"unknown config fields for TransformerLens {TL_VERSION}: {few(sorted(unknown))}")
    return _impl.make_config(**fields)


def functional_fields() -> frozenset[str]:
    """The installed config's fields that can change the forward pass (derived: see :mod:`.config`)."""
    return _config.functional_fields(config_fields())


def config_extras(cfg: Any) -> dict[str, Any]:
    """The functional fields of ``cfg`` beyond :data:`PORTABLE_FIELDS` that differ from a config of
    the same shape (``parallel_attn_mlp=True``, ``use_qk_norm=True`` ...)."""
    return _config.extra_fields(cfg, config_fields(), lambda core: ModelConfig(**core))  # the config's own defaults


def config_of(model: Model) -> dict[str, Any]:
    """What defines ``model``'s function: the portable fields and :func:`config_extras` (dtype as a ``torch.dtype``)."""
    return {k: getattr(model.cfg, k) for k in PORTABLE_FIELDS if hasattr(model.cfg, k)} | config_extras(model.cfg)


def readable_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The fields of a stored config to build from (see :func:`.config.readable_fields`).

    Raises:
        ValueError: a functional field the installed version does not know, not at its inert default.
    """
    return _config.readable_fields(data, config_fields(), TL_VERSION)


def with_dtype(model: Model, dtype: torch.dtype) -> Model:
    """A fresh copy of ``model`` in ``dtype`` (the caller copies modes); a Hugging Face-booted bridge
    is deep-copied, as TransformerLens cannot rebuild it from its config."""
    if _impl.is_hf_booted(model):
        return _impl.converted_copy(model, dtype)
    copy = build_model(make_config(**config_of(model) | {"dtype": dtype, "device": "cpu"}))
    load_portable_state(copy, {k: v.to(dtype) if v.is_floating_point() else v
                               for k, v in portable_state(model).items()})
    return copy


def expected_keys(model: Model) -> dict[str, tuple[int, ...]]:
    """The portable parameter names of ``model`` and their shapes.

    >>> from rs_interp.models import make_attn_only
    >>> sorted(expected_keys(make_attn_only(1)))[:3]
    ['blocks.0.attn.W_K', 'blocks.0.attn.W_O', 'blocks.0.attn.W_Q']
    """
    return {k: tuple(v.shape) for k, v in portable_state(model).items()}


def run_from(model: Model, x: torch.Tensor, *, start: int | None = None, stop: int | None = None,
             spe: torch.Tensor | None = None) -> torch.Tensor:
    """``model(x, start_at_layer=start, stop_at_layer=stop)``: the logits, or the stream before
    block ``stop`` (after the last block for ``stop = n_layers``). ``spe`` is the shortformer
    positional embedding (3.x only)."""
    if start is not None and stop is None and spe is None:
        return _impl.run_from_layer(model, x, start)  # 4.x: the blocks from ``start`` alone
    kwargs: dict[str, Any] = {} if start is None else {"start_at_layer": start}
    if spe is not None:
        kwargs["shortformer_pos_embed"] = spe
    if stop is None:
        return model(x, return_type="logits", **kwargs)
    return _impl.run_to(model, x, stop, **kwargs)


#: The modules a post-norm block applies to its sublayers' outputs before they enter the stream (Gemma-2/3's
#: ``post_attention_layernorm``/``post_feedforward_layernorm``, OLMo-2's), as both versions name them.
POST_NORMS = ("ln1_post", "ln2_post")


def _post_norm_names(model: Model) -> tuple[str, str]:
    """Where a block keeps its norms after the sublayers: ``ln1_post``/``ln2_post`` (Gemma-2/3 on both versions,
    OLMo-2 on 4.x); 3.x's OLMo-2 conversion (its ``POST_NORM_ARCHITECTURES``) puts them at ``ln1``/``ln2``,
    with no norm before the sublayers."""
    if getattr(model.cfg, "original_architecture", None) in _impl.post_norm_architectures():
        return ("ln1", "ln2")
    return POST_NORMS


def post_norms(model: Model, layer: int) -> tuple[Norm, Norm]:
    """The norms block ``layer`` applies to its attention's and its MLP's output before adding them to the
    stream (:class:`rs_interp.exact.norm.Norm`, as the model computes them), :data:`IDENTITY` where it has none.

    >>> from rs_interp.models import make_attn_only
    >>> post_norms(make_attn_only(1, normalization_type="LN"), 0) == (IDENTITY, IDENTITY)
    True
    """
    block = model.blocks[layer]
    return tuple(Norm(*norm_affine(model, m)) if isinstance(m := getattr(block, n, None), torch.nn.Module) else IDENTITY
                 for n in _post_norm_names(model))


def has_post_norms(model: Model) -> bool:
    """Whether any block normalises a sublayer's output before it enters the stream (:func:`post_norms`)."""
    return any(isinstance(getattr(block, n, None), torch.nn.Module)
               for block in model.blocks for n in _post_norm_names(model))


def mlp_norm_name(model: Model, layer: int) -> str:
    """The name of the norm block ``layer``'s MLP reads through: ``"ln2"``, or ``"ln1"`` on a parallel block with one
    shared input norm (Phi, Cohere, Falcon, GPT-J booted on 4.x: the MLP reads ``ln1(resid_pre)``, the attention's
    very input; 3.x copies that norm into an ``ln2`` of its own).

    >>> from rs_interp.models import make_attn_only
    >>> mlp_norm_name(make_attn_only(1, normalization_type="LN"), 0)
    'ln2'
    """
    subs = model.blocks[layer]._modules
    shared = "ln2" not in subs and "ln1" in subs and bool(getattr(model.cfg, "parallel_attn_mlp", False))
    return "ln1" if shared else "ln2"


def pre_norm(model: Model, layer: int, name: str) -> Norm:
    """The norm block ``layer`` applies before a sublayer (``name``: ``"ln1"`` or ``"ln2"``): the identity on a
    post-norm block that has none (OLMo-2 normalises only the sublayers' outputs: each reads the stream as is;
    3.x keeps those at ``ln1``/``ln2``: :func:`_post_norm_names`); ``"ln2"`` of a parallel block with one shared
    input norm is that norm, ``ln1`` (:func:`mlp_norm_name`).

    Raises:
        ValueError: the config says the model normalises, the block has no such norm, no shared input norm and no
            post-norm either.
    """
    block = model.blocks[layer]
    name = mlp_norm_name(model, layer) if name == "ln2" else name
    module = getattr(block, name, None)
    posts = _post_norm_names(model)
    if name in posts or (module is None and any(isinstance(getattr(block, n, None), torch.nn.Module) for n in posts)):
        return IDENTITY
    if module is None and model.cfg.normalization_type is not None:
        raise ValueError(f"the config says normalization_type={model.cfg.normalization_type!r}, but block {layer} has "
                         "no norm "
                         f"{name!r} before its {'attention' if name == 'ln1' else 'MLP'} (nor one shared input norm "
                         "'ln1' of a parallel block, nor a norm after each sublayer)")
    return norm_of(model, module)


def stream_writes(model: Model, name: str) -> tuple[str, ...]:
    """Where a change of the residual stream at hook point ``name`` is written so that every later reader sees
    it. 3.x's stream hooks are the stream. 4.3's ``hook_resid_mid`` is an alias of ``ln2.hook_in``: what it
    returns is the MLP's input only, and the block adds the stream it passes on apart from it (measured: a
    change written there alone never reaches the next block), so a change there is also written at
    ``hook_resid_post``. Removable when the bridge's ``hook_resid_mid`` is the stream itself."""
    from .. import _names as N

    layer = N.layer_of(name)
    if TL_MAJOR >= 4 and layer is not None and name == N.resid_mid(layer):
        return (name, N.resid_post(layer))
    return (name,)
