import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import rs_interp as ri
from rs_interp.gpt2_config import GPT2_SIZES


def test_gpt2_small_is_exactly_124439808():
    pc = ri.count_parameters(ri.gpt2_config("small"))
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
    assert ri.count_parameters(ri.gpt2_config(size)).total == hf.num_parameters()


@pytest.mark.parametrize("shape", [dict(n_layer=3, n_embd=96, n_head=4, vocab_size=1000, n_positions=64),
                                   dict(n_layer=1, n_embd=32, n_head=2, vocab_size=77, n_positions=16, n_inner=48)])
def test_other_gpt2_shapes(shape):
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config(**shape))
    cfg = ri.gpt2_config("small", n_layers=shape["n_layer"], d_model=shape["n_embd"], n_heads=shape["n_head"],
                         d_head=shape["n_embd"] // shape["n_head"], d_mlp=shape.get("n_inner") or 4 * shape["n_embd"],
                         d_vocab=shape["vocab_size"], n_ctx=shape["n_positions"])
    assert ri.count_parameters(cfg).total == hf.num_parameters()


def test_count_matches_an_allocated_transformerlens_model(gpt2_tiny):
    """Against the real HookedTransformer: all its parameters, less the extra b_U."""
    pc = ri.count_parameters(gpt2_tiny)
    n = sum(p.numel() for name, p in gpt2_tiny.named_parameters() if name != "unembed.W_U")
    assert pc.total == n - pc.unembed_bias


@pytest.mark.parametrize("size", sorted(GPT2_SIZES))
def test_config_matches_what_transformerlens_derives(size, monkeypatch):
    """TransformerLens's own conversion of each released config (served offline from GPT2Config)."""
    import transformers
    from transformer_lens import loading_from_pretrained as loading

    n_layers, d_model, n_heads = GPT2_SIZES[size]
    released = GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads, n_ctx=1024, architectures=["GPT2LMHeadModel"])
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: released)
    theirs = loading.convert_hf_model_config({"small": "gpt2"}.get(size, f"gpt2-{size}"))
    ours = ri.gpt2_config(size)
    for key, value in theirs.items():
        if hasattr(ours, key) and key not in ("tokenizer_name",):
            assert getattr(ours, key) == value, key


def test_bad_size():
    with pytest.raises(ValueError, match="size"):
        ri.gpt2_config("tiny")
