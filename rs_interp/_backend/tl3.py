"""What TransformerLens 3.x needs: ``HookedTransformer`` has every hook and flag rs_interp uses.

Its public functions are the backend's contract (:class:`.contract.Backend`), each with a twin of the same
signature in :mod:`.tl4`; the package picks one module at import (:mod:`rs_interp._backend`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch
from transformer_lens import HookedTransformer as Model
from transformer_lens import HookedTransformerConfig as ModelConfig

from .. import _names as N
from .._messages import few
from . import head_copies
from .common import _HT_BUFFERS, norm_kind, set_flag


def config_fields() -> frozenset[str]:
    """The field names ``HookedTransformerConfig`` accepts."""
    return frozenset(f.name for f in dataclasses.fields(ModelConfig))


def make_config(**fields: Any) -> ModelConfig:
    """``HookedTransformerConfig(**fields)`` (the caller has checked the names)."""
    return ModelConfig(**fields)


def build_model(cfg: ModelConfig) -> Model:
    """``HookedTransformer(cfg)``, without its deprecation warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        return Model(cfg)


def reinitialise(model: Model) -> None:
    """Draw ``model``'s weights again from the global RNG, as :func:`build_model` does (the same
    state gives the same weights as a fresh build: HookedTransformer draws only in ``init_weights``)."""
    model.init_weights()


def portable_state(model: Model) -> dict[str, torch.Tensor]:
    """The state dict without buffers: HookedTransformer's names and shapes are the portable ones."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith(_HT_BUFFERS)}


def load_portable_state(model: Model, state: dict[str, torch.Tensor]) -> None:
    """Load a portable state dict (buffers optional) in place.

    Raises:
        ValueError: a parameter of ``model`` is missing from ``state``.
    """
    state = {k: v for k, v in state.items() if not k.endswith(_HT_BUFFERS)}
    missing = model.load_state_dict(state, strict=False).missing_keys
    params = {k for k in missing if not k.endswith(_HT_BUFFERS)}
    if params:
        raise ValueError(f"missing parameters {few(sorted(params), 5)}")


@contextlib.contextmanager
def per_head_inputs(model: Model, fwd: Sequence[tuple[Any, Callable]]) -> Iterator[list[tuple[Any, Callable]]]:
    """TransformerLens's own per-head inputs: ``use_split_qkv_input`` on (through the model's
    setter) for the duration, restored after."""
    saved = bool(model.cfg.use_split_qkv_input)
    set_flag(model, "use_split_qkv_input", True)
    try:
        yield list(fwd)
    finally:
        set_flag(model, "use_split_qkv_input", saved)


def spanning_norms(model: Model) -> list[head_copies.SpanningNorm]:
    """The query and key norms that span the heads (3.9's OLMo-2, OLMo-3 and OLMoE attention: ``q_norm`` over
    ``n_heads * d_head``, ``k_norm`` over the KV heads'), each with the layer's own projection (``W_Q``,
    the KV heads' ``_W_K`` under grouped-query attention) and the module's own arithmetic."""
    out = []
    for l, block in enumerate(model.blocks):
        attn = block.attn
        for which in "qk":
            norm = getattr(attn, f"{which}_norm", None)
            if not head_copies.spans(norm, model.cfg.d_head):
                continue
            W = getattr(attn, f"_W_{which.upper()}", None) if which == "k" else None
            W = getattr(attn, f"W_{which.upper()}") if W is None else W  # (head or KV head, d_model, d_head)
            b = getattr(attn, f"_b_{which.upper()}", None) if which == "k" else None
            b = getattr(attn, f"b_{which.upper()}") if b is None else b

            def project(u: torch.Tensor, W: torch.Tensor = W, b: torch.Tensor = b) -> torch.Tensor:
                return (torch.einsum("...m,jmd->...jd", u, W.to(u.dtype)) + b.to(u.dtype)).flatten(-2)

            out.append(head_copies.SpanningNorm(l, which, norm, project, norm.forward))  # forward: no hook on itself
    return out


@contextlib.contextmanager
def seen_head_inputs(model: Model, box: dict) -> Iterator[None]:
    """Record in ``box`` each spanning layer's query and key inputs, (batch, pos, head, d_model) as the
    projection reads them (after ``ln1``), from the attention's own call (its keyword arguments)."""
    def seen(layer: int) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            for which, name in (("q", "query_input"), ("k", "key_input")):
                u = kwargs.get(name)
                if isinstance(u, torch.Tensor) and u.dim() == 4:
                    box[(layer, which)] = u
        return hook

    handles = [model.blocks[l].attn.register_forward_pre_hook(seen(l), with_kwargs=True)
               for l in sorted({n.layer for n in spanning_norms(model)})]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_from_layer(model: Model, x: torch.Tensor, start: int) -> torch.Tensor:
    """``model(x, start_at_layer=start)``: the logits from the stream entering block ``start`` (3.x runs only the blocks
    from there)."""
    return model(x, start_at_layer=start, return_type="logits")


def run_to(model: Model, x: torch.Tensor, stop: int, **kwargs: Any) -> torch.Tensor:
    """``model(x, stop_at_layer=stop)``: the stream before block ``stop`` (after the last for ``n_layers``)."""
    return model(x, stop_at_layer=stop, **kwargs)


def score_hooks(model: Model, layer: int, box: dict[str, torch.Tensor], key: str) -> list[tuple[str, Callable]]:
    """``hook_attn_scores`` holds the pre-softmax scores (batch, head, query, key)."""

    def keep(t: torch.Tensor, *, hook: Any) -> None:
        box[key] = t.detach()

    return [(N.scores(layer), keep)]


def apply_rotary(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The layer's own ``apply_rotary`` on ``x`` (batch, pos, head, d_head)."""
    return model.blocks[layer].attn.apply_rotary(x)


def attn_scale(model: Model, layer: int) -> float:
    """The layer's ``attn_scale``."""
    return float(model.blocks[layer].attn.attn_scale)


def bias_parameters(model: Model, names: Sequence[str]) -> list[torch.nn.Parameter]:
    """Every parameter whose leaf name is in ``names``."""
    return [p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in names]


def attention_output(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The attention module called with ``x`` as query, key and value input."""
    return model.blocks[layer].attn(x, x, x)


def mlp_out_parameter(model: Model, layer: int) -> torch.nn.Parameter:
    """``W_out`` itself."""
    return model.blocks[layer].mlp.W_out


def set_unembedding(model: Model, W_U: torch.Tensor) -> None:
    """Copy ``W_U`` (d_model, d_vocab) into the unembedding."""
    with torch.no_grad():
        model.unembed.W_U.copy_(W_U)


def gpt2_from_hf_dir(path: str, cfg: ModelConfig, *, fold_ln: bool, center_writing_weights: bool,
                     center_unembed: bool, dtype: torch.dtype) -> Model:
    """GPT-2 from a local Hugging Face directory: TransformerLens's weight conversion, then its processing."""
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import GPT2LMHeadModel

    # processed in dtype
    hf_model = GPT2LMHeadModel.from_pretrained(str(path), local_files_only=True, torch_dtype=dtype)
    state = convert_gpt2_weights(hf_model, cfg)
    model = build_model(cfg)
    model.load_and_process_state_dict(state, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                      center_unembed=center_unembed)
    return model


def gpt2_from_hub(name: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
                  dtype: torch.dtype) -> Model:
    """``HookedTransformer.from_pretrained``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return Model.from_pretrained(name, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                     center_unembed=center_unembed, dtype=dtype, device="cpu")


def from_hf(source: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
            dtype: torch.dtype) -> Model:
    """A Hugging Face model as a ``HookedTransformer``: from a local directory by TransformerLens's
    own config and weight conversion (the steps of ``from_pretrained``, which accepts hub names only),
    from the hub by ``from_pretrained``.

    A local directory is read through a folder of links named ``checkpoint``: 3.9's config conversion
    picks the architecture from the *name* when it contains "llama" or "gemma" and then reads no config
    (``convert_hf_model_config``). Remove when: TransformerLens 3.x reads a local directory's
    ``config.json`` whatever its name (3.9 does not).
    """
    import tempfile
    from pathlib import Path

    from transformer_lens import loading_from_pretrained as loading
    from transformers import AutoModelForCausalLM

    from ._tl3_configs import checkpoint_configs, rope_fields_readable

    processing = dict(fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        if not Path(source).is_dir():
            return Model.from_pretrained(str(source), dtype=dtype, device="cpu", **processing)
        with tempfile.TemporaryDirectory(prefix="rs_interp_hf_") as tmp:
            link = _linked_checkpoint(Path(source), Path(tmp) / "checkpoint")
            hf_model = AutoModelForCausalLM.from_pretrained(str(link), local_files_only=True, torch_dtype=dtype)
            with rope_fields_readable(link), checkpoint_configs(link):
                cfg = loading.get_pretrained_model_config(str(link), fold_ln=fold_ln, device="cpu", dtype=dtype)
            state = loading.get_pretrained_state_dict(str(link), cfg, hf_model=hf_model, dtype=dtype)
            if (cfg.output_logits_soft_cap or -1) > 0:  # a shift of the logits before a soft-cap is not one after it
                processing["center_unembed"] = False  # (4.x drops it too, with a warning)
            if cfg.original_architecture in post_norm_architectures():  # norms after the sublayers, at ln1/ln2:
                processing.update(fold_ln=False, center_writing_weights=False)  # nothing to fold into the next weights
            model = Model(cfg, move_to_device=False)
            tables = {n: b.clone() for n, b in model.named_buffers() if "rotary" in n}
            model.load_and_process_state_dict(state, **processing)
            # 3.9's loading leaves the rotary tables ~3e-8 off those a build in this dtype computes
            # (measured on float64): keep the build's, so every copy of the model is the same function
            for n, b in model.named_buffers():
                if n in tables:
                    b.copy_(tables[n])
    model.cfg.tokenizer_name = str(Path(source).resolve())  # not the temporary link
    return model


def _linked_checkpoint(source, folder):
    """``folder`` holding a link to every file of the checkpoint ``source``."""
    import os

    folder.mkdir()
    for f in source.resolve().iterdir():
        os.symlink(f, folder / f.name)
    return folder


def post_norm_architectures() -> frozenset[str]:
    """3.x's architectures whose blocks normalise only their sublayers' outputs (``POST_NORM_ARCHITECTURES``)."""
    try:
        from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES
    except ImportError:  # a 3.x without them converts none of these families
        return frozenset()
    return frozenset(POST_NORM_ARCHITECTURES)


def set_tokenizer(model: Model, tokenizer: Any) -> None:
    """``model.set_tokenizer(tokenizer)``."""
    model.set_tokenizer(tokenizer)


def is_hf_booted(model: Model) -> bool:
    """Never on 3.x: Hugging Face weights are converted into a ``HookedTransformer``."""
    return False


def converted_copy(model: Model, dtype: torch.dtype) -> Model:
    """Unused on 3.x (see :func:`is_hf_booted`)."""
    raise AssertionError("3.x models are rebuilt from their config")



def model_source(model: Model) -> str:
    """``"native"``: a ``HookedTransformer`` runs TransformerLens's own modules (Hugging Face
    checkpoints are converted into them)."""
    return "native"


def projection_layers(model: Model) -> set[int]:
    """The layers whose ``hook_{q,k,v}`` hold ``ln1(resid_pre) W + b`` per head: all, but with
    shortformer positions (queries and keys read the stream plus the positions) or ungrouped
    grouped-query weights."""
    cfg = model.cfg
    if cfg.positional_embedding_type == "shortformer" or getattr(cfg, "ungroup_grouped_query_attention", False):
        return set()
    return set(range(cfg.n_layers))


def norm_affine(model: Model,
                norm: torch.nn.Module) -> tuple[str | None, torch.Tensor | None, torch.Tensor | None, float]:
    """``(kind, gain, bias, eps)`` of one of the model's norms as it computes: ``kind`` as
    TransformerLens names it (None: no norm), the gain and bias it applies (None where it has none)."""
    kind = model.cfg.normalization_type
    if kind is None:
        return None, None, None, 0.0
    # the module's own kind where it says (a norm after a sublayer keeps its gain when the others are folded)
    kinds = {"LayerNorm": "LN", "LayerNormPre": "LNPre", "RMSNorm": "RMS", "RMSNormPre": "RMSPre"}
    kind = kinds.get(type(norm).__name__, kind)
    gain = getattr(norm, "w", None) if kind in ("LN", "RMS") else None
    bias = getattr(norm, "b", None) if kind == "LN" else None
    return norm_kind(kind in ("LN", "LNPre"), gain, bias), gain, bias, float(getattr(norm, "eps", model.cfg.eps))


def logits_with_grad(model: Model, tokens: torch.Tensor) -> torch.Tensor:
    """``model(tokens)``'s logits, with gradients. The forward is ended at ``unembed.hook_in`` and the
    unembedding applied here, to the same ``W_U``: 3.9's ``Unembed`` copies ``W_U.T`` (the whole
    (d_vocab, d_model) matrix) into a contiguous tensor on every call, the largest copy of a gradient
    pass (~0.2 s of 1.5 s on GPT-2 small at 64 tokens). Hooks on ``unembed.hook_in`` and
    ``unembed.hook_out`` still run; models with a logit softcap, or PyTorch hooks on the unembedding or the
    model, take the model's own path.

    Remove when: TransformerLens 3.x is no longer supported.
    """
    from .common import Stop

    unembed = getattr(model, "unembed", None)
    hooked = any(getattr(m, d) for m in (model, unembed) if m is not None
                 for d in ("_forward_hooks", "_forward_pre_hooks")) or "forward" in model.__dict__
    if (type(unembed).__name__ != "Unembed" or N.UNEMBED_IN not in model.hook_dict
            or getattr(model.cfg, "output_logits_soft_cap", -1.0) > 0 or hooked):  # hooked: the model's own path
        return model(tokens, return_type="logits")
    box: dict[str, torch.Tensor] = {}

    def grab(t: torch.Tensor, *, hook) -> None:
        box["x"] = t
        raise Stop

    try:
        with model.hooks(fwd_hooks=[(N.UNEMBED_IN, grab)]):
            model(tokens, return_type="logits")
    except Stop:
        pass
    return unembed.hook_out(torch.nn.functional.linear(box["x"], unembed.W_U.T, unembed.b_U))


@contextlib.contextmanager
def unembed_stored_transposed(model: Model) -> Iterator[None]:
    """``W_U`` stored column-major for the duration (the same values; restored after): 3.9's ``Unembed``
    passes ``W_U.T.contiguous()`` to ``F.linear``, a copy of the whole (d_vocab, d_model) matrix at every
    call, which on the certificate's small probe runs costs as much as the blocks (GPT-2 small, 16 tokens);
    stored so that ``W_U.T`` is contiguous, that copy is ``W_U.T`` itself: the model's own forward, the same
    weight tensor handed to ``F.linear``, the same logits to the bit.

    Remove when: TransformerLens 3.x is no longer supported (or its ``Unembed`` stops copying ``W_U``).
    """
    unembed = getattr(model, "unembed", None)
    W = getattr(unembed, "W_U", None)
    if type(unembed).__name__ != "Unembed" or not isinstance(W, torch.nn.Parameter) or W.T.is_contiguous():
        yield
        return
    saved = W.data
    W.data = saved.T.contiguous().T
    try:
        yield
    finally:
        W.data = saved


def pattern_after_attention(model: Model, layer: int) -> bool:
    """Whether an edit at ``attn.hook_pattern`` is discarded: never on 3.x (every attention computes through it)."""
    return False


def mlp_modules(model: Model, layer: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The modules an MLP's input and own output are read at: its module, for both, on 3.x."""
    return model.blocks[layer].mlp, model.blocks[layer].mlp


def is_own_hook(fn: Callable) -> bool:
    """Whether a PyTorch hook is TransformerLens's own wiring rather than a user's: never on 3.x."""
    return False


def other_version() -> str:
    """What to try when this version cannot load a family: the other version, and how."""
    return ("TransformerLens 4 (pip install 'transformer-lens>=4.3'; rs_interp's RS_INTERP_TL=4), which runs the "
            "Hugging Face modules themselves")
