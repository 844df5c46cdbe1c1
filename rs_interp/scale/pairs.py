"""The dataset of pairs, cut into batches: what every streamed analysis reads, and which rank reads what.

A dataset is a :class:`rs_interp.tasks.Task`, cut into batches of ``batch_size`` rows, or any iterable
of batches, each a :class:`Batch` or a (small) Task. A batch carries its metric and the **weight** of
that metric: the number of units (pairs, scored positions) its value is the mean over. The dataset's
metric is then

    M = sum over batches b of weight_b * M_b  /  sum over batches b of weight_b

which is what one call on the concatenated batch computes for every metric that is a mean over
examples (a Task's metric: weight = rows; :func:`rs_interp.next_token_loss`: weight = positions with
a target), and never a mean of per-batch means, which is wrong on an uneven last batch. A metric
given as a bare function carries no weight, so the streamed helpers take none (they refuse
``metric=``, naming why): each batch says what its metric averages over.

Batch ``k`` of the dataset goes to rank ``k mod world`` (:func:`batches`): deterministic, every batch
on exactly one rank, uneven shards allowed; an iterable must yield the same batches on every rank.

>>> from rs_interp.tasks import induction_task
>>> task = induction_task(37, seed=0, seq_len=12, min_period=3, max_period=5)
>>> tuple(b.rows for b in batches(task, 8, rank=1, world=2))   # batches 1 and 3 of 0 .. 4
(range(8, 16), range(24, 32))
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Iterator

import torch
from jaxtyping import Float, Int

from ..metrics import Metric, next_token_loss
from ..tasks.task import Task

__all__ = ["Batch", "Dataset", "batches", "n_batches", "RowScores"]

RowScores = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, " batch"]]
"""A function of the logits returning one score per row: its mean over the rows is a metric that
combines exactly over batches (weight = rows)."""


@dataclass(frozen=True, eq=False)
class Batch:
    """One batch of pairs and the metric measured on it.

    Give the metric in one of three ways: ``metric`` with its ``weight`` (the number of units its value
    is the mean over), ``scores`` (one score per row: the metric is their mean, the weight the rows),
    or ``targets`` alone (the next-token loss, the weight the positions with a target). A batch
    without any is read only by the analyses that need no metric (the lenses; DLA reads ``targets``).

    Attributes:
        tokens: (batch, pos) the run's tokens.
        reference: (batch, pos) the reference run's (the corrupted prompts), row for row.
        metric: this batch's :data:`rs_interp.Metric`, a mean over ``weight`` units.
        weight: how many units ``metric`` averages over.
        scores: per-row scores (:data:`RowScores`), instead of ``metric``.
        targets: (batch, pos) token ids, -1 where a position is skipped (DLA, the lenses, the next-token loss).
        contrast: (batch, pos) token ids DLA subtracts the logit of, -1 where ``targets`` is.
        rows: the dataset rows this batch holds, where known (a Task's batches).
        task: the Task this batch was cut from (its rows only), where it was.

    Raises:
        ValueError: tokens that are not a (batch, pos) integer tensor, a metric without its weight, two
            ways of giving the metric, a weight that is not a positive number or disagrees with the
            rows (``scores``) or the targets (the next-token loss).

    Example:
        >>> import torch
        >>> b = Batch(torch.zeros(3, 5, dtype=torch.long), targets=torch.tensor([[1, 2, -1, -1, -1]] * 3))
        >>> b.weight, round(float(b.metric(torch.zeros(3, 5, 4))), 4)   # 6 positions with a target; ln 4
        (6.0, 1.3863)
    """

    tokens: Int[torch.Tensor, "batch pos"]
    reference: Int[torch.Tensor, "batch pos"] | None = None
    metric: Metric | None = None
    weight: float | None = None
    scores: RowScores | None = None
    targets: Int[torch.Tensor, "batch pos"] | None = None
    contrast: Int[torch.Tensor, "batch pos"] | None = None
    rows: range | None = None
    task: Task | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "reference", "targets", "contrast"):
            t = getattr(self, name)
            if t is not None and (not isinstance(t, torch.Tensor) or t.ndim != 2 or t.dtype.is_floating_point
                                  or t.dtype == torch.bool):
                raise ValueError(f"Batch.{name} must be a (batch, pos) integer tensor, got {_describe(t)}")
        if self.metric is not None and self.scores is not None:
            raise ValueError("Batch: give metric (with its weight) or scores, not both")
        rows = self.tokens.shape[0]
        weight = self.weight
        if self.metric is not None:
            if weight is None:
                raise ValueError("Batch.metric needs its weight: the number of examples (or scored positions) the "
                                 "metric's value is the mean over. The dataset's metric is sum_b weight_b metric_b / "
                                 "sum_b weight_b, exact only with each batch's weight (or give scores=, one score per "
                                 "row: the weight is then the rows)")
        elif self.scores is not None:
            weight = _agree("scores", weight, rows)
            object.__setattr__(self, "metric", _mean_of(self.scores, rows))
        elif self.targets is not None:
            weight = _agree("targets", weight, int((self.targets >= 0).sum()))
            object.__setattr__(self, "metric", next_token_loss(self.targets))
        if weight is not None:
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (0 < weight < math.inf):
                raise ValueError(f"Batch.weight must be a positive number, got {weight!r}")
            object.__setattr__(self, "weight", float(weight))

    def __len__(self) -> int:
        return self.tokens.shape[0]


Dataset = Task | Iterable[Batch | Task]
"""What the streamed helpers read: a Task (cut into ``batch_size`` rows at a time) or an iterable of
batches, each a :class:`Batch` or a Task."""


def _agree(what: str, weight: float | None, count: int) -> float:
    if weight is not None and float(weight) != count:
        raise ValueError(f"Batch: weight {weight} disagrees with {what}, whose mean is over {count} units")
    if count == 0:
        raise ValueError(f"Batch: {what} leave no unit to average over (a weight of 0)")
    return float(count)


def _mean_of(scores: RowScores, rows: int) -> Metric:
    def metric(logits: torch.Tensor) -> torch.Tensor:
        s = scores(logits)
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != (rows,):
            shape = f" of shape {tuple(s.shape)}" if isinstance(s, torch.Tensor) else ""
            raise ValueError(f"Batch.scores must return one score per row, shape ({rows},), got {_describe(s)}{shape}")
        return s.mean()

    return metric


def _describe(t: Any) -> str:
    return f"a {t.ndim}-D {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__


def _from_task(task: Task, rows: range | None = None, kind: str | None = None) -> Batch:
    """The Batch of ``task``'s ``rows`` (all by default): its own metric, weight = its rows."""
    if rows is not None and (rows.start, rows.stop) != (0, len(task)):
        s = slice(rows.start, rows.stop)
        task = Task(task.name, clean=task.clean[s], corrupted=task.corrupted[s], answers=task.answers[s],
                    wrong=task.wrong[s], positions=task.positions[s], kind=task.kind,
                    label=None if task.label is None else task.label[s],
                    prompts=None if task.prompts is None else task.prompts[s],
                    corrupted_prompts=None if task.corrupted_prompts is None else task.corrupted_prompts[s],
                    seed=task.seed)
    return Batch(task.clean, task.corrupted, metric=task.metric(kind), weight=len(task), rows=rows, task=task)


def _check_batch_size(data: Any, batch_size: int | None) -> None:
    if isinstance(data, Task):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int (rows per batch of the Task), got {batch_size!r}")
    elif batch_size is not None:
        raise ValueError("batch_size cuts a Task into batches; an iterable of batches is read as it comes (its items "
                         f"are the batches): pass batch_size=None, got {batch_size!r}")
    elif isinstance(data, (torch.Tensor, str, bytes)) or not isinstance(data, Iterable):
        raise ValueError("the dataset must be a rs_interp.tasks.Task or an iterable of Batch (or Task), got "
                         f"{type(data).__name__}")


def n_batches(data: Dataset, batch_size: int | None = None) -> int | None:
    """How many batches the dataset holds (None for an iterable without a length).

    >>> from rs_interp.tasks import induction_task
    >>> n_batches(induction_task(37, seed=0), 8)
    5
    """
    _check_batch_size(data, batch_size)
    if isinstance(data, Task):
        return -(-len(data) // batch_size)
    return len(data) if hasattr(data, "__len__") else None


def batches(data: Dataset, batch_size: int | None = None, *, rank: int = 0, world: int = 1,
            kind: str | None = None) -> Iterator[Batch]:
    """This rank's batches, in order: batch ``k`` of the dataset when ``k mod world == rank``.

    Args:
        data: a Task (cut into ``batch_size`` rows at a time, the last batch holding what is left) or
            an iterable of :class:`Batch` or Task (``batch_size=None``: its items are the batches).
        rank: this process's rank, in ``[0, world)``.
        world: the number of ranks (``world=1``: every batch).
        kind: a Task's metric kind (``task.metric(kind)``), for Task data.

    Raises:
        ValueError: a bad ``batch_size``, rank or world, a ``kind`` for batches that carry their own
            metric, or an item that is neither a Batch nor a Task.
    """
    _check_batch_size(data, batch_size)
    if (isinstance(world, bool) or not isinstance(world, int) or world < 1 or not isinstance(rank, int)
            or not 0 <= rank < world):
        raise ValueError(f"rank must lie in [0, world) and world be a positive int, got rank={rank!r}, world={world!r}")
    if isinstance(data, Task):
        for start in range(rank * batch_size, len(data), world * batch_size):
            yield _from_task(data, range(start, min(start + batch_size, len(data))), kind)
        return
    for k, item in enumerate(data):
        if k % world != rank:
            continue
        if isinstance(item, Task):
            yield _from_task(item, None, kind)
        elif isinstance(item, Batch):
            if kind is not None:
                raise ValueError("kind= chooses a Task's metric; a Batch carries its own metric")
            yield item
        else:
            raise ValueError(f"item {k} of the dataset is a {type(item).__name__}: every item must be a Batch or a "
                             "Task")


def batch_digest(h: Any, batch: Batch) -> None:
    """Feed ``batch``'s data (tensors, weight, rows; a Task's digest) into the hash ``h``: a resumed
    run checks that the batches it skips are the ones the interrupted run read."""
    for f in fields(Batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor):
            h.update(f"{f.name}{tuple(v.shape)}{v.dtype}".encode() + v.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(v, Task):
            h.update(v.digest().encode())
        elif f.name in ("weight", "rows"):
            h.update(f"{f.name}={v!r}".encode())


def new_digest() -> Any:
    """An empty running hash of the batches read (:func:`batch_digest`)."""
    return hashlib.sha256(b"rs_interp.scale batches\0")
