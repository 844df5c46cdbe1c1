"""The GPT-2 analysis of ``rs-interp gpt2`` and the report: head roles on repeated random tokens, the
logit lens on a factual prompt, and the offline conversion check on a random Hugging Face GPT-2.

>>> fields = GPT2Analysis.__dataclass_fields__
>>> "top_induction" in fields
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._backend import Model
from ..heads.roles import induction_scores, prev_token_scores
from ..labels import head_label
from ..models.data import induction_batch
from ..models.gpt2 import load_gpt2
from ..readouts.lens import logit_lens

__all__ = ["GPT2Analysis", "analyse_gpt2", "conversion_check"]


@dataclass(frozen=True)
class GPT2Analysis:
    """What ``rs-interp gpt2`` reports for one model.

    Attributes:
        weights: ``"pretrained"`` or ``"random"`` (and where they came from, in ``source``).
        prev_token: (layer, head) previous-token scores on repeated random tokens.
        induction: (layer, head) induction scores (weight on the induction target).
        top_prev_token, top_induction: the ten best heads of each, as ``"L{l}H{h}"`` labels
            (:func:`rs_interp.head_label`), best first.
        prompt: the logit-lens prompt (None without a tokenizer).
        prompt_answer: the token whose probability is tracked (e.g. ``" Paris"``).
        lens_labels, lens_p_answer: the logit-lens curve of P(answer) at the prompt's last position.
        final_top_token: the model's top prediction for the prompt.
    """

    weights: str
    source: str
    prev_token: torch.Tensor
    induction: torch.Tensor
    top_prev_token: tuple[str, ...]
    top_induction: tuple[str, ...]
    prompt: str | None = None
    prompt_answer: str | None = None
    lens_labels: tuple[str, ...] = ()
    lens_p_answer: tuple[float, ...] = ()
    final_top_token: str | None = None


def _top_heads(scores: torch.Tensor, k: int = 10) -> tuple[str, ...]:
    H = scores.shape[1]
    order = scores.flatten().argsort(descending=True)[:k]
    return tuple(head_label(*divmod(int(i), H)) for i in order)


def analyse_gpt2(
    model: Model,
    *,
    weights: str,
    source: str = "",
    prompt: str = "The Eiffel Tower is in the city of",
    answer: str = " Paris",
    seed: int = 0,
    n_sequences: int = 8,
    period: int = 50,
) -> GPT2Analysis:
    """Head roles on repeated random tokens, and the logit lens on a factual prompt.

    Repeated random tokens: ``n_sequences`` blocks of ``period`` random tokens, each shown twice.
    The logit lens runs only when the model has a tokenizer.
    """
    batch = induction_batch(n_sequences, seed=seed, d_vocab=model.cfg.d_vocab, seq_len=2 * period,
                            min_period=period, max_period=period)
    prev = prev_token_scores(model, batch.tokens)
    ind = induction_scores(model, batch.tokens, periods=batch.periods).induction
    out = dict(weights=weights, source=source, prev_token=prev, induction=ind,
               top_prev_token=_top_heads(prev), top_induction=_top_heads(ind))
    answer_ids = model.to_tokens(answer, prepend_bos=False)[0] if model.tokenizer is not None else None
    if answer_ids is not None and answer_ids.numel() != 1:
        raise ValueError(f"answer must be a single token for this tokenizer, got {answer!r} -> {answer_ids.tolist()}")
    if model.tokenizer is not None:
        tokens = model.to_tokens(prompt)
        answer_id = int(answer_ids[0])
        targets = torch.full_like(tokens, -1)
        targets[0, -1] = answer_id
        lens = logit_lens(model, tokens, targets=targets, k=1)
        out.update(prompt=prompt, prompt_answer=answer, lens_labels=lens.labels,
                   lens_p_answer=tuple(float(p) for p in lens.target_probs[:, 0, -1]),
                   final_top_token=model.tokenizer.decode([int(lens.top_tokens[-1, 0, -1, 0])]))
    return GPT2Analysis(**out)


def conversion_check(*, seed: int = 0, n_tokens: int = 32) -> float:
    """Max |difference| of centered logits between a random ``GPT2LMHeadModel(GPT2Config())`` and
    the same weights loaded through :func:`load_gpt2` from a temporary checkpoint directory.

    Exercises the whole offline loading path (safetensors, config, TransformerLens's conversion
    and LayerNorm folding) on weights that need no download.
    """
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(GPT2Config()).eval()
        tokens = torch.randint(0, hf.config.vocab_size, (2, n_tokens))
    with tempfile.TemporaryDirectory(prefix="rs_interp_gpt2_") as d:
        hf.save_pretrained(d)
        model = load_gpt2(d)
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    center = lambda x: x - x.mean(-1, keepdim=True)  # noqa: E731
    return float((center(ours) - center(theirs)).abs().max())
