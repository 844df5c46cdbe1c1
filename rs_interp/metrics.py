"""What the patching helpers measure: the one ``Metric`` type, the next-token loss, a metric's direction,
and ranking effects.

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

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int

__all__ = ["Metric", "next_token_loss", "Direction", "direction", "declared_direction", "declare_direction"]

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
    if (not isinstance(targets, torch.Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool
            or targets.ndim != 2):
        raise ValueError("targets must be an integer (batch, pos) tensor of token ids, -1 where a position is skipped")
    targets = targets.long()
    if int((targets >= 0).sum()) == 0:
        raise ValueError("targets skips every position (all -1); a loss needs at least one target")

    def metric(logits: Float[torch.Tensor, "batch pos d_vocab"]) -> Float[torch.Tensor, ""]:
        if tuple(logits.shape[:2]) != tuple(targets.shape):
            raise ValueError(f"next_token_loss: logits (batch, pos) {tuple(logits.shape[:2])} differ from targets' "
                             f"{tuple(targets.shape)}")
        x = logits if logits.dtype == torch.float64 else logits.float()
        return F.cross_entropy(x.flatten(0, 1), targets.to(logits.device).flatten(), ignore_index=-1)

    return declare_direction(metric, False)  # a loss: lower is better


def declare_direction(metric: Metric, higher_is_better: bool) -> Metric:
    """``metric`` itself, marked with its direction (``metric.higher_is_better``), which :func:`direction`
    reads before anything else but an explicit argument: :func:`next_token_loss` declares ``False`` (a
    loss), a task's :meth:`rs_interp.tasks.Task.metric` ``True`` (a logit or probability difference).

    >>> m = declare_direction(lambda logits: logits[:, -1, 0].mean(), True)
    >>> m.higher_is_better
    True
    """
    if not isinstance(higher_is_better, bool):
        raise ValueError(f"higher_is_better must be True or False, got {higher_is_better!r}")
    metric.higher_is_better = higher_is_better  # type: ignore[attr-defined]
    return metric


@dataclass(frozen=True)
class Direction:
    """A metric's direction, and where it was taken from (:func:`direction`).

    Attributes:
        higher_is_better: whether a larger metric means more of the behaviour (a logit difference: True;
            a loss: False).
        source: ``"argument"`` (given), ``"metric"`` (declared by the metric: :func:`declare_direction`) or
            ``"clean and empty"`` (read from the runs: the clean run's metric above the empty circuit's).
    """

    higher_is_better: bool
    source: str


def declared_direction(metric: Metric, higher_is_better: bool | None = None) -> Direction | None:
    """The direction :func:`direction` takes before any run: ``higher_is_better`` if given, else the metric's
    declaration; None when neither says (then only the runs can).

    Raises:
        ValueError: ``higher_is_better`` not a bool or None.
    """
    if higher_is_better is not None:
        if not isinstance(higher_is_better, bool):
            raise ValueError("higher_is_better must be True, False or None (from the metric), "
                             f"got {higher_is_better!r}")
        return Direction(higher_is_better, "argument")
    declared = getattr(metric, "higher_is_better", None)
    return Direction(declared, "metric") if isinstance(declared, bool) else None


def direction(metric: Metric, clean: float, empty: float, higher_is_better: bool | None = None) -> Direction:
    """The one rule for a metric's direction (MIB's signed ranking, CPR and the files it reads depend on it):
    an explicit ``higher_is_better`` wins; else the metric's own declaration (:func:`declare_direction`:
    :func:`next_token_loss` and a task's metric declare theirs); else it is read from the runs, higher is
    better when the clean run's metric is above the empty circuit's (every edge ablated: under
    ``"resample"`` the corrupted run), the direction in which faithfulness rises from 0 to 1.

    Raises:
        ValueError: ``higher_is_better`` not a bool or None; or nothing to read it from (no argument, no
            declaration, and the clean run and the empty circuit give the same metric).

    >>> direction(lambda x: x, clean=2.5, empty=0.5)
    Direction(higher_is_better=True, source='clean and empty')
    >>> direction(next_token_loss(torch.tensor([[1]])), clean=2.5, empty=0.5).source
    'metric'
    """
    known = declared_direction(metric, higher_is_better)
    if known is not None:
        return known
    if clean == empty:
        raise ValueError("the metric's direction cannot be read from the runs: the clean run and the empty circuit "
                         f"both give {clean:.6g}. Pass higher_is_better=True (a logit or probability difference) or "
                         "False (a loss).")
    return Direction(clean > empty, "clean and empty")


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
        raise ValueError(f"metric must return a number or a one-element tensor, got {type(value).__name__} "
                         f"{value!r:.60} ({what})")
    else:
        out = float(value)
    if out != out or out in (float("inf"), float("-inf")):
        raise ValueError(f"metric returned {out} on {what}: a metric must be finite")
    return out
