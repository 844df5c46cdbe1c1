"""The memory budget: one default for every helper's ``memory_budget``, and how many copies of a batch
one stacked forward pass may hold within it.

The scan and exact path patching run several ablations or patches in one pass, stacked along the
batch; one sizer says how many. The logit lens, the second-order attribution and the QK fix tile
their work within the same budget. The budget only tiles: every result is the same to the bit
whatever it is (tests/test_vocabulary.py compares a tiny budget with the default).
"""

from __future__ import annotations

import torch

from ._backend import Model

__all__: list[str] = []

#: Bytes one stacked pass or tile may use (roughly): every helper's ``memory_budget`` default (1 GiB).
MEMORY_BUDGET = 2**30


def stacked_copies(model: Model, batch: int, pos: int, budget: int, *, logit_positions: int | None = None) -> int:
    """Copies of a (batch, pos) input one pass may stack within ``budget`` bytes, at least one: per
    copy and position, a block's transients (a few streams and the MLP's hidden layer) and the logits
    at ``logit_positions`` positions per sequence (default: every position).

    >>> from rs_interp import make_attn_only
    >>> stacked_copies(make_attn_only(2), 4, 48, 2**22), stacked_copies(make_attn_only(2), 4, 48, 1)
    (8, 1)
    """
    cfg = model.cfg
    logit_rows = pos if logit_positions is None else logit_positions
    per_copy = (pos * (8 * cfg.d_model + (cfg.d_mlp or 0)) + logit_rows * cfg.d_vocab) * torch.finfo(cfg.dtype).bits // 8
    return max(1, budget // max(1, batch * per_copy))
