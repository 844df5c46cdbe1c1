"""Repeated random sequences: the induction task of the theory.

A block of ``p`` random tokens, ``p`` uniform in ``[min_period, max_period]``, is repeated to
``seq_len`` tokens. The logit at position ``i`` predicts token ``i + 1`` and is scored when
``i >= p``: from there the current token occurred one period back and its successor is known.

>>> b = induction_batch(4, seed=0)
>>> b.tokens.shape, b.scored.shape
(torch.Size([4, 48]), torch.Size([4, 47]))
>>> bool((b.tokens[:, :b.periods[0]] == b.tokens[:, b.periods[0]:2*b.periods[0]])[0].all())
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int

from ..exact.validate import check_int_range

__all__ = ["InductionBatch", "induction_batch", "next_token_targets"]


@dataclass(frozen=True)
class InductionBatch:
    """A batch of repeated random sequences.

    Attributes:
        tokens: (batch, pos) token ids.
        periods: (batch,) the period ``p`` of each sequence.
        scored: (batch, pos - 1) True where the logit at ``i`` (predicting ``i + 1``) is scored, ``i >= p``.

    >>> b = induction_batch(2, seed=0, seq_len=8, min_period=3, max_period=3)
    >>> b.tokens[0, :3].tolist() == b.tokens[0, 3:6].tolist(), b.periods.tolist()
    (True, [3, 3])
    >>> b.targets[0].tolist()[:3], b.scored[0].tolist()[:4]  # -1: the first period is not scored
    ([-1, -1, -1], [False, False, False, True])
    """

    tokens: Int[torch.Tensor, "batch pos"]
    periods: Int[torch.Tensor, " batch"]
    scored: Bool[torch.Tensor, "batch pos_minus_1"]

    @property
    def targets(self) -> Int[torch.Tensor, "batch pos"]:
        """The ``targets=`` of this batch, (batch, pos): the next token at scored positions, -1 (skip)
        elsewhere, as :func:`next_token_targets` with the unscored positions skipped too."""
        out = next_token_targets(self.tokens)
        out[:, :-1][~self.scored] = -1
        return out

    @property
    def induction_targets(self) -> Int[torch.Tensor, "batch pos_minus_1"]:
        """Position ``i - p + 1`` for every query position ``i`` (meaningful where scored)."""
        pos = torch.arange(self.tokens.shape[1] - 1)
        return (pos[None] - self.periods[:, None] + 1).clamp(min=0)


def next_token_targets(tokens: Int[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, "batch pos"]:
    """The token after each position, (batch, pos), with -1 at the last position (no next token).

    What every helper's ``targets=`` takes (-1 marks a position to skip); never ``tokens.roll(-1, 1)``,
    which would make the first token the last position's target.

    >>> next_token_targets(torch.tensor([[5, 6, 7]])).tolist()
    [[6, 7, -1]]
    """
    return torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -1)], 1)


def induction_batch(
    batch_size: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    model: Any = None,
    d_vocab: int | None = None,
    seq_len: int | None = None,
    min_period: int = 6,
    max_period: int = 24,
) -> InductionBatch:
    """Draw ``batch_size`` repeated random sequences.

    Give either ``seed`` (a fresh generator) or ``generator`` (advanced in place, for streams of
    fresh batches); with neither, a seed-0 generator is used so the call stays deterministic.
    ``model=`` fits the batch to a model: its vocabulary and context (``d_vocab=model.cfg.d_vocab``,
    ``seq_len=model.cfg.n_ctx``, e.g. 2,048 and 64 for ``code-2l``); without it, the toy models'
    256 and 48. ``d_vocab`` and ``seq_len`` given explicitly win.

    Raises:
        ValueError: ``batch_size < 1``, ``d_vocab < 1``, ``seq_len < 2``, or period bounds outside
            ``1 <= min_period <= max_period <= seq_len``.

    >>> batch = induction_batch(200, seed=1)
    >>> tuple(batch.tokens.shape), int(batch.periods.min()) >= 6, int(batch.periods.max()) <= 24
    ((200, 48), True, True)
    >>> bool(torch.equal(induction_batch(4, seed=1).tokens, induction_batch(4, seed=1).tokens))
    True
    >>> from rs_interp import load_toy_model
    >>> tuple(induction_batch(2, seed=0, model=load_toy_model("code-2l")).tokens.shape)
    (2, 64)
    """
    if model is not None:
        d_vocab = model.cfg.d_vocab if d_vocab is None else d_vocab
        seq_len = model.cfg.n_ctx if seq_len is None else seq_len
    d_vocab = 256 if d_vocab is None else d_vocab
    seq_len = 48 if seq_len is None else seq_len
    check_int_range("batch_size", batch_size, 1)
    check_int_range("d_vocab", d_vocab, 1)
    check_int_range("seq_len", seq_len, 2)
    check_int_range("min_period", min_period, 1, seq_len)
    check_int_range("max_period", max_period, min_period, seq_len)
    if seed is not None and generator is not None:
        raise ValueError("give seed or generator, not both")
    if generator is None:
        generator = torch.Generator().manual_seed(0 if seed is None else seed)
    periods = torch.randint(min_period, max_period + 1, (batch_size,), generator=generator)
    blocks = torch.randint(0, d_vocab, (batch_size, seq_len), generator=generator)
    pos = torch.arange(seq_len)
    # Position i copies position i mod p of the block.
    tokens = torch.gather(blocks, 1, pos[None] % periods[:, None])
    scored = pos[None, :-1] >= periods[:, None]
    return InductionBatch(tokens=tokens, periods=periods, scored=scored)
