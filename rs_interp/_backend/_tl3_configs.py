"""TransformerLens 3.x configs read from a checkpoint's ``config.json`` for the families 3.9 converts only
from their hub names (private to :mod:`rs_interp._backend.tl3`).

3.9 writes Gemma-2's and Gemma-3's configs per official model (``google/gemma-2-2b`` ...), never from a checkpoint's own
config, so a local Gemma-2 checkpoint is refused (``NotImplementedError``) though 3.9 builds the model:
a norm before and after each sublayer (``use_normalization_before_and_after``), local and global layers,
soft-capped scores and logits, and converts its weights (``convert_gemma_weights``). :func:`checkpoint_config`
writes that config from the checkpoint's fields, as 3.9 writes it for the hub's Gemma-2 models; the load
then measures the model against the checkpoint (``source``), so a field read wrong is refused, not used.

Gemma-3 (text) likewise, with its query/key norms and a rotary base per layer kind, and OLMo-2 (3.9 places its
norms after the sublayers under the pre-norms' names ``ln1``/``ln2``: :func:`rs_interp._backend.post_norms` reads
them there).

Remove when: TransformerLens 3.x reads a local Gemma-2/3 or OLMo-2 checkpoint's ``config.json`` (3.9 does not).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


def _rope_theta(hf: Any, default: float) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(hf, "rope_theta", None) or default)


def _gemma2(hf: Any) -> dict[str, Any]:
    n = hf.num_hidden_layers
    types = getattr(hf, "layer_types", None) or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                 for i in range(n)]
    cap = lambda c: -1.0 if c is None else float(c)  # noqa: E731  (3.9's "no soft-cap")
    return {
        "d_model": hf.hidden_size, "d_head": hf.head_dim, "n_heads": hf.num_attention_heads,
        "d_mlp": hf.intermediate_size, "n_layers": n, "n_ctx": hf.max_position_embeddings, "eps": hf.rms_norm_eps,
        "d_vocab": hf.vocab_size,
        "act_fn": hf.hidden_activation, "initializer_range": hf.initializer_range, "normalization_type": "RMS",
        "rotary_base": _rope_theta(hf, 10000.0), "positional_embedding_type": "rotary", "use_attn_scale": True,
        "attn_scale": float(hf.query_pre_attn_scalar) ** 0.5, "n_key_value_heads": hf.num_key_value_heads,
        "window_size": hf.sliding_window, "use_local_attn": True,
        "attn_types": ["local" if t == "sliding_attention" else "global" for t in types],
        "attn_scores_soft_cap": cap(hf.attn_logit_softcapping),
        "output_logits_soft_cap": cap(hf.final_logit_softcapping),
        "gated_mlp": True, "final_rms": True, "use_normalization_before_and_after": True,
    }


def _gemma3(hf: Any) -> dict[str, Any]:
    """Gemma-3 (text): Gemma-2's form with query/key norms, a rotary base per layer kind and no soft-caps;
    refused (KeyError, named at load) where the global layers scale their rotary (3.9 reads one linear factor)."""
    params = getattr(hf, "rope_parameters", None) or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    scaling = {k: v for k, v in full.items() if k not in ("rope_theta", "rope_type")}
    if full.get("rope_type", "default") not in ("default", "linear") or set(scaling) - {"factor"}:
        raise KeyError(f"a rotary scaling 3.9 does not read ({full})")
    out = _gemma2(hf) | {"use_qk_norm": True, "rotary_base": float(full.get("rope_theta", 1e6)),
                         "rotary_base_local": float(local.get("rope_theta", 1e4))}
    if full.get("rope_type") == "linear":
        out["rotary_scaling_factor"] = float(scaling["factor"])
    return out


def _olmo2(hf: Any) -> dict[str, Any]:
    """OLMo-2: norms after the sublayers only (3.9's ``POST_NORM_ARCHITECTURES``: at ``ln1``/``ln2``), query/key
    norms."""
    kv = hf.num_key_value_heads
    return {  # (3.9 builds grouped-query attention wherever n_key_value_heads is set: only where it groups)
        "d_model": hf.hidden_size, "d_head": hf.hidden_size // hf.num_attention_heads,
        "n_heads": hf.num_attention_heads,
        "n_key_value_heads": kv if kv not in (None, hf.num_attention_heads) else None, "d_mlp": hf.intermediate_size,
        "n_layers": hf.num_hidden_layers,
        "n_ctx": hf.max_position_embeddings, "eps": hf.rms_norm_eps, "d_vocab": hf.vocab_size, "act_fn": hf.hidden_act,
        "initializer_range": hf.initializer_range, "normalization_type": "RMS", "positional_embedding_type": "rotary",
        "rotary_base": _rope_theta(hf, 500000.0), "gated_mlp": True, "attn_types": ["global"] * hf.num_hidden_layers,
        "tie_word_embeddings": bool(getattr(hf, "tie_word_embeddings", False)),
    }


#: architecture -> the config 3.9 writes for it, from the checkpoint's fields.
CONFIGS = {"Gemma2ForCausalLM": _gemma2, "Gemma3ForCausalLM": _gemma3, "Olmo2ForCausalLM": _olmo2}


def checkpoint_config(hf: Any, name: str) -> dict[str, Any] | None:
    """The 3.x config dict (``convert_hf_model_config``'s form) of the checkpoint whose transformers config is
    ``hf``, for the architectures of :data:`CONFIGS`; None for every other (3.9's own conversion reads it)."""
    arch = (getattr(hf, "architectures", None) or [None])[0]
    build = CONFIGS.get(arch)
    if build is None:
        return None
    return build(hf) | {"original_architecture": arch, "tokenizer_name": name, "quantization_method": None}


@contextlib.contextmanager
def checkpoint_configs(folder: Any) -> Iterator[None]:
    """For the duration, 3.9's ``convert_hf_model_config`` answers for the families it converts only by hub
    name (Gemma-2/3, OLMo-2) from the checkpoint's own config (:func:`checkpoint_config`); itself for every other."""
    from transformer_lens import loading_from_pretrained as loading
    from transformers import AutoConfig

    cfg = checkpoint_config(AutoConfig.from_pretrained(str(folder), local_files_only=True), str(folder))
    if cfg is None:
        yield
        return
    original = loading.convert_hf_model_config
    loading.convert_hf_model_config = lambda name, **kwargs: dict(cfg)
    try:
        yield
    finally:
        loading.convert_hf_model_config = original


@contextlib.contextmanager
def rope_fields_readable(folder: Any) -> Iterator[None]:
    """For the duration, the rotary settings transformers 5 keeps under ``rope_parameters`` (e.g. Phi's
    ``partial_rotary_factor``) readable as attributes of the checkpoint's config class, where
    TransformerLens 3.9's conversion reads them (an AttributeError otherwise); the class as it was after.

    Remove when: TransformerLens 3.x reads ``rope_parameters`` for every field (3.9 reads ``rope_theta`` only).
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    cls = type(config)
    added = [k for k in (getattr(config, "rope_parameters", None) or {}) if k != "rope_type" and not hasattr(config, k)]
    for k in added:
        setattr(cls, k, property(lambda self, k=k: (self.rope_parameters or {}).get(k)))
    try:
        yield
    finally:
        for k in added:
            delattr(cls, k)
