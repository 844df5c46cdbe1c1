"""The memory budget: one default for every helper's ``memory_budget``, and how many copies of a batch
one stacked forward pass may hold within it.

The scan and exact path patching run several ablations or patches in one pass, stacked along the
batch; one sizer says how many. The logit lens, the second-order attribution and the QK fix tile
their work within the same budget. The budget only tiles: measured bit for bit (a budget of one byte
against this default, on the toy models and on a GPT-2-shaped model), the logit lens, the
second-order attribution, the head ablation scan and the QK fix give the same floats whatever it is;
exact path patching (and ``fix_unreliable``, which runs it) can differ in the last bits of a float32
model's effects (2e-6 on GPT-2's shape, 2 layers, effects up to 0.33: BLAS sums a stack of a
different height in another order), so its default stayed where it was, 2**30. The logit lens and the
second-order attribution moved from 2**28 to this default (issue 51), which changed none of their numbers.
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

    >>> from rs_interp.models import make_attn_only
    >>> stacked_copies(make_attn_only(2), 4, 48, 2**22), stacked_copies(make_attn_only(2), 4, 48, 1)
    (8, 1)
    """
    cfg = model.cfg
    logit_rows = pos if logit_positions is None else logit_positions
    per_copy = ((pos * (8 * cfg.d_model + (cfg.d_mlp or 0)) + logit_rows * cfg.d_vocab)
                * torch.finfo(cfg.dtype).bits // 8)
    return max(1, budget // max(1, batch * per_copy))
