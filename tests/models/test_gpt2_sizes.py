import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import rs_interp as ri
from rs_interp import _backend
from rs_interp.models.gpt2_sizes import GPT2_SIZES, count_parameters, gpt2_config
from tests.builders import tl3_only


def test_gpt2_small_is_exactly_124439808():
    pc = ri.count_parameters(ri.models.gpt2_config("small"))
    assert pc.total == 124_439_808
    assert pc.by_category == {"token_embedding": 38_597_376, "positional_embedding": 786_432, "attention": 28_348_416,
                              "mlp": 56_669_184, "layernorm": 38_400}
    assert pc.per_layer == {"attention": 2_362_368, "mlp": 4_722_432, "layernorm": 3_072}
    assert pc.unembed_bias == 50_257


@pytest.mark.parametrize("size", sorted(GPT2_SIZES))
def test_every_size_matches_transformers_without_allocating(size, monkeypatch):
    """Count from the config alone, against transformers' own count on a meta-device model."""
    n_layers, d_model, n_heads = GPT2_SIZES[size]
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads))
    assert ri.count_parameters(ri.models.gpt2_config(size)).total == hf.num_parameters()


@pytest.mark.parametrize("shape", [dict(n_layer=3, n_embd=96, n_head=4, vocab_size=1000, n_positions=64),
                                   dict(n_layer=1, n_embd=32, n_head=2, vocab_size=77, n_positions=16, n_inner=48)])
def test_other_gpt2_shapes(shape):
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(**shape))
    cfg = ri.models.gpt2_config("small", n_layers=shape["n_layer"], d_model=shape["n_embd"], n_heads=shape["n_head"],
                         d_head=shape["n_embd"] // shape["n_head"], d_mlp=shape.get("n_inner") or 4 * shape["n_embd"],
                         d_vocab=shape["vocab_size"], n_ctx=shape["n_positions"])
    assert ri.count_parameters(cfg).total == hf.num_parameters()


def test_count_matches_an_allocated_transformerlens_model(gpt2_tiny):
    """Against the real HookedTransformer: all its parameters, less the extra b_U."""
    pc = ri.count_parameters(gpt2_tiny)
    n = sum(p.numel() for name, p in _backend.portable_state(gpt2_tiny).items() if name != "unembed.W_U")
    assert pc.total == n - pc.unembed_bias  # the portable state carries b_U (zero on 4.x) under either version


@tl3_only("loading_from_pretrained, TransformerLens's own config derivation, was removed in 4.0")
@pytest.mark.parametrize("size", sorted(GPT2_SIZES))
def test_config_matches_what_transformerlens_derives(size, monkeypatch):
    """TransformerLens's own conversion of each released config (served offline from GPT2Config)."""
    import transformers
    from transformer_lens import loading_from_pretrained as loading

    n_layers, d_model, n_heads = GPT2_SIZES[size]
    released = GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads, n_ctx=1024, architectures=["GPT2LMHeadModel"])
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: released)
    theirs = loading.convert_hf_model_config({"small": "gpt2"}.get(size, f"gpt2-{size}"))
    ours = ri.models.gpt2_config(size)
    for key, value in theirs.items():
        if hasattr(ours, key) and key not in ("tokenizer_name",):
            assert getattr(ours, key) == value, key


def test_bad_size():
    with pytest.raises(ValueError, match="size"):
        ri.models.gpt2_config("tiny")


@pytest.mark.parametrize("n_heads", [1, 6, 12, 24, 48])
def test_heads_split_a_fixed_budget(n_heads):
    """The GPT-2 module: moving n_heads does not change the total (d_head = d_model / n_heads)."""
    cfg = gpt2_config("small", n_heads=n_heads)
    assert cfg.d_head * n_heads == 768
    assert count_parameters(cfg).total == 124_439_808


def test_overriding_d_model_derives_the_rest_and_matches_transformer_lens():
    cfg = gpt2_config("small", d_model=384, n_heads=6, n_layers=2, d_vocab=100)
    assert (cfg.d_head, cfg.d_mlp) == (64, 1536)
    assert count_parameters(cfg).total == _materialised(cfg)
    with pytest.raises(ValueError, match="multiple"):
        gpt2_config("small", n_heads=7)


def _materialised(cfg) -> int:
    """TransformerLens's own parameters (b_U excluded: not in a GPT-2 checkpoint; W_U tied to W_E)."""
    from rs_interp.models.checkpoints import build_model

    model = build_model(cfg)  # small configs only: a real allocation
    return sum(p.numel() for n, p in _backend.portable_state(model).items() if n not in ("unembed.W_U", "unembed.b_U"))


@tl3_only("the native gated MLP has no biases, so its count differs from GPT-2-style gated MLPs")
def test_gated_mlp_at_eight_thirds_keeps_the_weight_count():
    """The module's SwiGLU remark: three matrices at d_mlp = 8/3 d_model hold the 4x MLP's weights."""
    plain = gpt2_config("small", d_model=768, n_layers=2, d_vocab=100)
    gated = gpt2_config("small", d_model=768, n_layers=2, d_vocab=100, gated_mlp=True, d_mlp=2048, act_fn="silu")
    w = lambda cfg: count_parameters(cfg).per_layer["mlp"] - cfg.d_mlp - cfg.d_model  # noqa: E731  (weights only)
    assert w(gated) == w(plain) == 8 * 768 ** 2
    assert count_parameters(gated).total == _materialised(gated)


def test_mlp_to_attention_is_two_to_one_before_biases():
    pc = count_parameters(gpt2_config("small"))
    d = 768
    attn_w, mlp_w = pc.per_layer["attention"] - 4 * d, pc.per_layer["mlp"] - 5 * d  # biases: 3d + d; 4d + d
    assert mlp_w / attn_w == 2.0
