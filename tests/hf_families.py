"""Tiny random Hugging Face checkpoints of many families, saved as a user would save them
(``save_pretrained`` with a tokenizer beside the weights), every weight perturbed so that no bias or
gain sits at its initial value. ``transformers`` builds each offline from its config class.

Shared by tests/integration/test_pretrained.py (the five families rs_interp was first tested on) and
tests/integration/test_families.py (every family beyond them, under both TransformerLens versions).
"""

from __future__ import annotations

import torch

#: The shapes every family shares: 2 layers, 4 heads of 8 dimensions, a 300-token vocabulary.
COMMON = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=300,
              max_position_embeddings=64)

#: family -> its config, from ``transformers`` (imported late: ``T``).
FAMILIES = {
    "gpt2": lambda T: T.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=64),
    "gpt_neox": lambda T: T.GPTNeoXConfig(**COMMON, rotary_pct=0.5, use_parallel_residual=True),
    "llama": lambda T: T.LlamaConfig(**COMMON, num_key_value_heads=2),
    "gptj": lambda T: T.GPTJConfig(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=64, rotary_dim=4),
    "qwen3": lambda T: T.Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=8),
    # beyond the first five
    "bloom": lambda T: T.BloomConfig(n_layer=2, hidden_size=32, n_head=4, vocab_size=300),
    "phi": lambda T: T.PhiConfig(**COMMON, partial_rotary_factor=0.5),
    "gemma": lambda T: T.GemmaConfig(**COMMON, num_key_value_heads=2, head_dim=8),
    "gemma2": lambda T: T.Gemma2Config(**COMMON, num_key_value_heads=2, head_dim=8, sliding_window=16),
    "gemma3": lambda T: T.Gemma3TextConfig(**COMMON, num_key_value_heads=2, head_dim=8, sliding_window=16),
    "olmo": lambda T: T.OlmoConfig(**COMMON),
    "olmo2": lambda T: T.Olmo2Config(**COMMON),
    "stablelm": lambda T: T.StableLmConfig(**COMMON, partial_rotary_factor=0.5),
    "mistral": lambda T: T.MistralConfig(**COMMON, num_key_value_heads=2),
    "mixtral": lambda T: T.MixtralConfig(**COMMON, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen2": lambda T: T.Qwen2Config(**COMMON, num_key_value_heads=2),
    # a sliding window of 8 on every layer: past the load check's first probe (issue 49)
    "qwen2_window": lambda T: T.Qwen2Config(**COMMON, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                                            max_window_layers=0),
    "opt": lambda T: T.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, ffn_dim=48, vocab_size=300,
                                 max_position_embeddings=64, word_embed_proj_dim=32),
    "gpt_neo": lambda T: T.GPTNeoConfig(num_layers=2, hidden_size=32, num_heads=4, vocab_size=300, max_position_embeddings=64,
                                        attention_types=[[["global", "local"], 1]], window_size=16),
    "phi3": lambda T: T.Phi3Config(**COMMON, num_key_value_heads=2, pad_token_id=0),
    "llama_bias": lambda T: T.LlamaConfig(**COMMON, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    "falcon": lambda T: T.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=300),
    "cohere": lambda T: T.CohereConfig(**COMMON, num_key_value_heads=2),
    "gpt_bigcode": lambda T: T.GPTBigCodeConfig(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=64),
}


def save_checkpoint(family: str, folder, families: dict | None = None) -> None:
    """A random checkpoint of ``family`` (a key of ``families``, default :data:`FAMILIES`) in ``folder``,
    every parameter moved by N(0, 0.2) (seeded), with a word-level tokenizer of the 300 ids."""
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = T.AutoModelForCausalLM.from_config((families or FAMILIES)[family](T)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():  # every bias and gain away from its initial value, signals well above rounding
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(299)} | {"[UNK]": 299}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="t0", eos_token="t0").save_pretrained(folder)


def metric(logits):
    """The checkpoints' metric: token 1's logit minus token 2's at the last position, averaged."""
    return (logits[:, -1, 1] - logits[:, -1, 2]).mean()


def token_pair():
    """``(tokens, reference)``: two (3, 9) batches of the checkpoints' 300 ids (seeded)."""
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 299, (3, 9), generator=g), torch.randint(0, 299, (3, 9), generator=g)
