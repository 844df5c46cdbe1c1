"""The induction task as a :class:`~rs_interp.tasks.Task`: repeated random sequences
(:func:`rs_interp.induction_batch`).

Each clean row is a block of ``p`` random tokens repeated to ``seq_len`` tokens; its corrupted row is
another such sequence, drawn independently. At the last position induction predicts the token one
period back's successor, ``clean[seq_len - p]``; the wrong answer is the corrupted row's own
induction answer, so the metric (the logit difference) is positive where the model copies from the
clean row's repeat and negative where it copies from the corrupted one's. Rows whose two answers
coincide are redrawn (the next draws of the same generator).

>>> task = induction_task(4, seed=0, seq_len=12, min_period=3, max_period=5)
>>> row, p = task.clean[0].tolist(), int(task.label[0])
>>> row[:p] == row[p:2 * p], int(task.answers[0, 0]) == row[12 - p]
(True, True)
"""

from __future__ import annotations

import torch

from .task import Task

__all__ = ["induction_task"]


def induction_task(n: int = 32, *, seed: int = 0, d_vocab: int = 256, seq_len: int = 48, min_period: int = 6,
                   max_period: int = 24) -> Task:
    """``n`` induction rows (module docstring): token ids only, no tokenizer needed.

    Args:
        n: number of rows.
        seed: seeds one ``torch.Generator`` that draws every row (the same seed, the same task).
        d_vocab: tokens are drawn from ``[0, d_vocab)`` (the model's vocabulary, or a part of it).
        seq_len, min_period, max_period: as :func:`rs_interp.induction_batch`; ``max_period < seq_len``
            so that the last token has occurred one period earlier.

    Returns:
        A :class:`Task` named ``"induction"`` (``kind="logit_diff"``); its ``label`` holds each clean
        row's period.

    Raises:
        ValueError: bad sizes (``rs_interp.induction_batch``'s checks), ``max_period >= seq_len``, or
            ``d_vocab < 2`` (the two answers could never differ).

    Example:
        >>> t = induction_task(3, seed=0)
        >>> tuple(t.clean.shape), t.positions.tolist(), bool((t.answers != t.wrong).all())
        ((3, 48), [47, 47, 47], True)
    """
    from ..models.data import induction_batch

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if max_period >= seq_len:
        raise ValueError(f"max_period ({max_period}) must be below seq_len ({seq_len}): the last token must repeat")
    if d_vocab < 2:
        raise ValueError(f"d_vocab must be at least 2 (the clean and corrupted answers must differ), got {d_vocab}")
    g = torch.Generator().manual_seed(seed)
    kw = dict(generator=g, d_vocab=d_vocab, seq_len=seq_len, min_period=min_period, max_period=max_period)
    clean, corrupted, p_clean, p_corr = [], [], [], []
    while sum(len(t) for t in clean) < n:
        a, b = induction_batch(n, **kw), induction_batch(n, **kw)
        ans_a = a.tokens[torch.arange(n), seq_len - a.periods]
        ans_b = b.tokens[torch.arange(n), seq_len - b.periods]
        keep = (ans_a != ans_b).nonzero().flatten()[: n - sum(len(t) for t in clean)]
        clean.append(a.tokens[keep]), corrupted.append(b.tokens[keep])
        p_clean.append(a.periods[keep]), p_corr.append(b.periods[keep])
    clean_t, corrupted_t, pa, pb = (torch.cat(x) for x in (clean, corrupted, p_clean, p_corr))
    rows = torch.arange(n)
    return Task("induction", clean=clean_t, corrupted=corrupted_t,
                answers=clean_t[rows, seq_len - pa][:, None], wrong=corrupted_t[rows, seq_len - pb][:, None],
                positions=torch.full((n,), seq_len - 1, dtype=torch.long), kind="logit_diff", label=pa, seed=seed)
