"""GPT-2 configurations written out, and exact parameter counts from a config alone.

GPT-2 small: 38,597,376 (token embedding) + 786,432 (positions) + 28,348,416 (attention)
+ 56,669,184 (MLP) + 38,400 (LayerNorm) = 124,439,808, the published count. The unembedding is
tied to the token embedding in the checkpoint and counted once; TransformerLens's ``b_U``, which
the checkpoint does not have, is reported separately.

>>> count_parameters(gpt2_config("small")).total
124439808
"""

from __future__ import annotations

from dataclasses import dataclass

from .._backend import Model, ModelConfig, make_config

__all__ = ["gpt2_config", "GPT2_SIZES", "ParameterCount", "count_parameters"]

#: (n_layers, d_model, n_heads) of each released GPT-2 size; d_head = 64, d_mlp = 4 d_model.
GPT2_SIZES = {"small": (12, 768, 12), "medium": (24, 1024, 16), "large": (36, 1280, 20), "xl": (48, 1600, 25)}
_HF_NAMES = {"small": "gpt2", "medium": "gpt2-medium", "large": "gpt2-large", "xl": "gpt2-xl"}


def gpt2_config(size: str = "small", **overrides) -> ModelConfig:
    """GPT-2's hyperparameters as a ``ModelConfig``, with no hub call.

    The same values TransformerLens derives for ``"gpt2"`` (and ``-medium``, ``-large``, ``-xl``):
    learned absolute positions, pre-LN blocks with LayerNorm eps 1e-5, GELU (``gelu_new``) MLPs of
    width ``4 d_model``, ``d_vocab = 50257``, ``n_ctx = 1024``.

    Overrides derive what the GPT-2 module derives: heads split a fixed budget, so overriding
    ``n_heads`` or ``d_model`` sets ``d_head = d_model / n_heads`` (unless ``d_head`` is given), and
    overriding ``d_model`` sets ``d_mlp = 4 d_model`` (unless ``d_mlp`` is given). A gated MLP
    (``gated_mlp=True``) keeps the weight count of the 4x MLP at ``d_mlp = 8/3 d_model``.

    >>> cfg = gpt2_config("medium")
    >>> cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head
    (24, 1024, 16, 64)
    >>> gpt2_config("small", n_heads=24).d_head   # 24 heads of 32: the same parameters
    32
    """
    if size not in GPT2_SIZES:
        raise ValueError(f"size must be one of {sorted(GPT2_SIZES)}, got {size!r}")
    n_layers, d_model, n_heads = GPT2_SIZES[size]
    fields = dict(
        model_name=_HF_NAMES[size], original_architecture="GPT2LMHeadModel",
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads, d_mlp=4 * d_model,
        d_vocab=50257, n_ctx=1024, eps=1e-5, act_fn="gelu_new", normalization_type="LN",
        positional_embedding_type="standard", use_attn_scale=True, use_local_attn=False,
        scale_attn_by_inverse_layer_idx=False, default_prepend_bos=True, seed=None, device="cpu",
    )
    if ("n_heads" in overrides or "d_model" in overrides) and "d_head" not in overrides:
        d, h = overrides.get("d_model", d_model), overrides.get("n_heads", n_heads)
        if d % h:
            raise ValueError(f"d_model {d} is not a multiple of n_heads {h}: pass d_head explicitly")
        fields["d_head"] = d // h
    if "d_model" in overrides and "d_mlp" not in overrides:
        fields["d_mlp"] = 4 * overrides["d_model"]
    fields.update(overrides)
    return make_config(**fields)


@dataclass(frozen=True)
class ParameterCount:
    """Parameters of a GPT-2-style checkpoint.

    Attributes:
        total: everything in the checkpoint, the tied unembedding counted once.
        by_category: ``token_embedding``, ``positional_embedding``, ``attention``, ``mlp``, ``layernorm``.
        per_layer: the same split for one block (attention, mlp, layernorm).
        unembed_bias: TransformerLens's ``b_U`` (d_vocab zeros, not in the checkpoint; not in ``total``).
        untied_unembedding: ``W_U`` if it were not tied (not in ``total``).

    >>> pc = count_parameters(gpt2_config("small"))
    >>> pc.total, pc.by_category["mlp"] / pc.by_category["attention"]  # MLPs: twice the attention's
    (124439808, 1.999...)
    """

    total: int
    by_category: dict[str, int]
    per_layer: dict[str, int]
    unembed_bias: int
    untied_unembedding: int


def count_parameters(model_or_cfg: Model | ModelConfig) -> ParameterCount:
    """Count a GPT-2-style model's parameters from its config, allocating no weights.

    Attention: ``W_Q, W_K, W_V`` with biases (``3 (d_model n_heads d_head + n_heads d_head)``) and
    ``W_O`` with its bias (``n_heads d_head d_model + d_model``). MLP: ``W_in, b_in, W_out, b_out``,
    plus ``W_gate`` (``d_model d_mlp``) for a gated (SwiGLU-style) MLP.
    LayerNorm: a gain and a bias of ``d_model`` each, two per block (one without MLPs) and the final one.

    >>> pc = count_parameters(gpt2_config("small"))
    >>> pc.per_layer
    {'attention': 2362368, 'mlp': 4722432, 'layernorm': 3072}
    """
    cfg = model_or_cfg.cfg if isinstance(model_or_cfg, Model) else model_or_cfg
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"model_or_cfg must be a Model or ModelConfig, got {type(model_or_cfg).__name__}")
    d, H, dh, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab
    attn = 3 * (d * H * dh + H * dh) + H * dh * d + d
    mlp = 0 if cfg.attn_only else (3 if cfg.gated_mlp else 2) * d * cfg.d_mlp + cfg.d_mlp + d
    has_ln = cfg.normalization_type in ("LN", "LNPre")
    ln_per = (2 * d) * (1 if cfg.attn_only else 2) if has_ln else 0
    positional = cfg.n_ctx * d if cfg.positional_embedding_type == "standard" else 0
    by_category = {
        "token_embedding": V * d,
        "positional_embedding": positional,
        "attention": cfg.n_layers * attn,
        "mlp": cfg.n_layers * mlp,
        "layernorm": cfg.n_layers * ln_per + (2 * d if has_ln else 0),
    }
    return ParameterCount(total=sum(by_category.values()), by_category=by_category,
                          per_layer={"attention": attn, "mlp": mlp, "layernorm": ln_per},
                          unembed_bias=V, untied_unembedding=d * V)
