"""Which config fields define the function a model computes, and how they travel.

The functional fields are derived, not listed: every field the installed version's config has,
minus :data:`NON_FUNCTIONAL` (where a model runs, which optional hook points fire, bookkeeping;
``tests/models/test_checkpoints.py`` checks that flipping each of those leaves the logits unchanged). A copy
(:func:`rs_interp.as_dtype`) and a checkpoint carry the core fields :data:`PORTABLE_FIELDS` and every
other functional field whose value differs from what a config of the same shape would hold; a field
a builder cannot honour, or a checkpoint field the installed version does not know, is refused by
name (``ValueError``) unless it holds its inert default.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .common import PORTABLE_FIELDS

#: Fields that never change what a model computes from its weights.
NON_FUNCTIONAL = frozenset({
    # where it runs
    "device", "n_devices",
    # which optional hook points fire
    "use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in", "use_hook_tokens",
    # bookkeeping: provenance, tokenizer, counts, initialisation switches, adapter selection
    "from_checkpoint", "checkpoint_index", "checkpoint_label_type", "checkpoint_value", "tokenizer_name",
    "tokenizer_prepends_bos", "tokenizer_appends_eos", "default_padding_side", "n_params", "trust_remote_code",
    "init_weights", "architecture", "attn_implementation", "is_audio_model", "is_multimodal", "is_stateful",
    "is_visual_model",
    # derived from normalization_type; weights are saved untied (the function is the weights')
    "uses_rms_norm", "tie_word_embeddings",
})

#: TransformerLens 3.x fields 4.x's config does not have, with their 3.x defaults: a checkpoint
#: holding these values reads under 4.x; any other value is refused by name.
TL3_ONLY_DEFAULTS: Mapping[str, Any] = {
    "NTK_original_ctx_len": 8192, "clip_qkv": None, "norm_topk_prob": False, "quantization_method": None,
    "rotary_base_local": None, "rotary_scaling_factor": 1.0, "train_seq_length": None,
    "ungroup_grouped_query_attention": False, "use_attention_sinks": False, "use_dynamic_ntk_rope": False,
    "use_logn_attn": False, "use_yarn_rope": False, "yarn_attention_factor": 1.0, "yarn_beta_fast": 32.0,
    "yarn_beta_slow": 1.0, "yarn_factor": 1.0, "yarn_global_attn_only": False,
    "yarn_original_max_position_embeddings": 4096, "yarn_truncate": True,
}


def functional_fields(known: frozenset[str]) -> frozenset[str]:
    """The fields of ``known`` (a config's field names) that can change the forward pass."""
    return frozenset(known - NON_FUNCTIONAL)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    try:
        return bool(a == b)
    except Exception:  # values without a plain equality
        return a is b


def extra_fields(cfg: Any, known: frozenset[str], baseline: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """The functional fields of ``cfg`` beyond :data:`PORTABLE_FIELDS` whose value differs from a
    config built from its core fields alone (``baseline(core)``)."""
    core = {k: getattr(cfg, k) for k in PORTABLE_FIELDS if hasattr(cfg, k)}
    base = baseline(core | {"device": "cpu"})
    return {k: getattr(cfg, k) for k in sorted(functional_fields(known) - set(PORTABLE_FIELDS))
            if hasattr(cfg, k) and not _same(getattr(cfg, k), getattr(base, k, None))}


def readable_fields(data: Mapping[str, Any], known: frozenset[str], version: str) -> dict[str, Any]:
    """The fields of a stored config to build from: the functional ones; non-functional ones dropped.

    Raises:
        ValueError: a functional field the installed version does not know, holding a value other
            than its inert default (named).
    """
    out = {}
    for k, v in data.items():
        if k in NON_FUNCTIONAL:
            continue
        if k in known or k in PORTABLE_FIELDS:
            out[k] = v
        elif not (v is None or v is False or (k in TL3_ONLY_DEFAULTS and _same(v, TL3_ONLY_DEFAULTS[k]))):
            raise ValueError(f"field {k}={v!r} changes what the model computes and TransformerLens {version} has no "
                             "such field")
    return out
