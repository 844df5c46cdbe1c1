"""What the patching helpers measure: the one ``Metric`` type, the next-token loss, and ranking effects.

A ``Metric`` is any function of the logits (batch, pos, d_vocab) returning a scalar tensor (a 0-d
tensor; differentiable for attribution patching). :func:`next_token_loss` builds the usual one from
``targets`` (-1 = skip that position), e.g. ``next_token_targets(tokens)`` or an induction batch's
``targets``.

>>> import torch
>>> from rs_interp import next_token_targets
>>> tokens = torch.tensor([[1, 2, 3]])
>>> loss = next_token_loss(next_token_targets(tokens))
>>> logits = torch.zeros(1, 3, 4)
>>> round(float(loss(logits)), 4)  # uniform over 4 tokens at the 2 positions with a target
1.3863
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int

__all__ = ["Metric", "next_token_loss"]

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]
"""A function of the logits (batch, pos, d_vocab) returning a scalar tensor: what
``head_ablation_scan``, ``attribution_patching``, ``edge_attribution_patching``, ``path_patching``
and the circuit functions measure. Differentiable for attribution patching.

:func:`next_token_loss` builds the usual one; any function of the logits will do, e.g. the logit
difference of two tokens at the last position:

>>> import torch
>>> from rs_interp import head_ablation_scan, load_toy_model
>>> logit_diff = lambda logits: (logits[:, -1, 1] - logits[:, -1, 2]).mean()  # a Metric
>>> scan = head_ablation_scan(load_toy_model("induction-2l"), torch.arange(12)[None], logit_diff)
>>> tuple(scan.effect.shape), isinstance(scan.clean, float)
((2, 2), True)
"""


def next_token_loss(targets: Int[torch.Tensor, "batch pos"]) -> Metric:
    """The mean cross-entropy of ``targets`` over the positions that have one (``-1`` = skip).

    Returns a :data:`Metric`: ``metric(logits)`` with ``logits`` of shape (batch, pos, d_vocab)
    matching ``targets``; computed in float32 at least (float64 stays float64), differentiable.

    Raises:
        ValueError: ``targets`` is not an integer (batch, pos) tensor, or skips every position; the
            metric raises it when the logits' (batch, pos) differ from ``targets``'.

    >>> import torch
    >>> metric = next_token_loss(torch.tensor([[2, -1]]))
    >>> logits = torch.tensor([[[0.0, 0.0, 10.0], [5.0, 0.0, 0.0]]])
    >>> float(metric(logits)) < 1e-3
    True
    """
    if not isinstance(targets, torch.Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.ndim != 2:
        raise ValueError("targets must be an integer (batch, pos) tensor of token ids, -1 where a position is skipped")
    targets = targets.long()
    if int((targets >= 0).sum()) == 0:
        raise ValueError("targets skips every position (all -1); a loss needs at least one target")

    def metric(logits: Float[torch.Tensor, "batch pos d_vocab"]) -> Float[torch.Tensor, ""]:
        if tuple(logits.shape[:2]) != tuple(targets.shape):
            raise ValueError(f"next_token_loss: logits (batch, pos) {tuple(logits.shape[:2])} differ from targets' {tuple(targets.shape)}")
        x = logits if logits.dtype == torch.float64 else logits.float()
        return F.cross_entropy(x.flatten(0, 1), targets.to(logits.device).flatten(), ignore_index=-1)

    return metric


def top_effects(labels: Sequence[str], effect: torch.Tensor, k: int) -> list[tuple[str, float]]:
    """The ``k`` entries of ``effect`` (any shape, flattened row-major like ``labels``) largest in
    magnitude, with their labels, largest first; NaN entries are never picked."""
    from ._format import Top
    from .exact.validate import check_int_range

    check_int_range("k", k, 1)
    flat = effect.flatten()
    if len(labels) != flat.numel():
        raise ValueError(f"{len(labels)} labels for {flat.numel()} effects")
    size = flat.abs().nan_to_num(-1.0)  # NaN (no such edge) sorts last
    order = [int(i) for i in size.argsort(descending=True, stable=True)[:k] if not bool(flat[i].isnan())]
    return Top((labels[i], float(flat[i])) for i in order)


def metric_value(value: object, what: str) -> float:
    """A metric's result as a finite float: a number or a one-element tensor; a ValueError naming
    ``what`` (the run it was computed on) otherwise, NaN and infinity included (every helper
    compares metrics: a NaN would pass silently through every comparison).

    >>> metric_value(torch.tensor(0.5), "clean run")
    0.5
    >>> metric_value(float("nan"), "head (0, 1)")
    Traceback (most recent call last):
    ...
    ValueError: metric returned nan on head (0, 1): a metric must be finite
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"metric must return a scalar, got a tensor of shape {tuple(value.shape)} ({what})")
        out = float(value.detach())
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"metric must return a number or a one-element tensor, got {type(value).__name__} {value!r:.60} ({what})")
    else:
        out = float(value)
    if out != out or out in (float("inf"), float("-inf")):
        raise ValueError(f"metric returned {out} on {what}: a metric must be finite")
    return out
