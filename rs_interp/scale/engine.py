"""The loop every streamed analysis runs: this rank's batches, float64 sums, resume files, one reduction.

For each of this rank's batches (:func:`rs_interp.scale.pairs.batches`) the analysis runs its
one-batch helper, turns the result into parts (:mod:`rs_interp.scale.sums`) and adds them; every
``save_every`` batches the sums and the position go to the resume file (:mod:`rs_interp.scale.resume`);
at the end the ranks' sums are added (:func:`rs_interp.scale.distributed.reduce`) and the result is
built from the totals. Memory: the sums (the size of one result) and one batch's work; the dataset is
read batch by batch. A progress bar (rank 0's, after two seconds) counts the batches, with an ETA when
their number is known (a Task, or an iterable with a length); the helpers' own bars stay off.

>>> import rs_interp as ri
>>> from rs_interp import scale
>>> from rs_interp.tasks import induction_task
>>> model, task = ri.load_toy_model("induction-2l"), induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
>>> streamed = scale.edge_attribution_patching(model, task, batch_size=2, progress=False)
>>> one = ri.edge_attribution_patching(model, task.clean, task.metric(), reference=task.corrupted)
>>> bool(torch.allclose(streamed.effect.nan_to_num(), one.effect.nan_to_num(), atol=1e-5))
True
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from .._backend import Model
from .._progress import bar
from ..exact.validate import check_int_range
from .distributed import reduce, world
from .pairs import Batch, Dataset, batch_digest, batches, n_batches, new_digest
from .resume import fingerprint, load, rank_path, save
from .sums import Sums

#: Set by :func:`stream` while it runs a single batch with progress on: the helper draws the bar (:func:`quiet`).
_INNER_BARS: contextvars.ContextVar[bool] = contextvars.ContextVar("rs_interp_inner_bars", default=False)

__all__ = ["Analysis", "stream"]  # and, for the analyses: weight_of, no_overrides, quiet


@dataclass(frozen=True)
class Analysis:
    """One streamed analysis: how to run it on a batch, split its result, and build the total.

    Attributes:
        name: what the progress bar and the resume file call it (e.g. ``"edge attribution patching"``).
        run: ``run(model, batch)``, the one-batch helper's result.
        parts: ``parts(result, batch)``, the float64 parts that add over batches and the fixed fields.
        build: ``build(totals, fixed, model)``, the result from the totals.
        options: the options it was called with (in the resume file's fingerprint).
    """

    name: str
    run: Callable[[Any, Batch], Any]
    parts: Callable[[Any, Batch], tuple[dict[str, torch.Tensor], dict]]
    build: Callable[[dict[str, torch.Tensor], dict, Any], Any]
    options: Mapping[str, Any]


def stream(analysis: Analysis, model: Model, data: Dataset, *, batch_size: int | None = None,
           resume: str | os.PathLike | None = None, save_every: int = 1, progress: bool = True,
           kind: str | None = None) -> Any:
    """Run ``analysis`` over the dataset (module docstring) and return what one call on the
    concatenated batch returns.

    Args:
        data: a :class:`rs_interp.tasks.Task` or an iterable of :class:`rs_interp.scale.Batch` (or Task).
        batch_size: rows per batch of a Task (None for an iterable of batches).
        resume: a file for the partial sums: read first if it exists (the run goes on from where it
            stopped), written every ``save_every`` of this rank's batches and at the end. Under
            ``torchrun`` each rank has its own (:func:`rs_interp.scale.resume.rank_path`).
        save_every: batches between two writes of ``resume`` (a killed run loses at most these).
        progress: a progress bar over the batches (rank 0's).
        kind: a Task's metric kind (``task.metric(kind)``); default the task's own.

    Raises:
        ValueError: a bad dataset, batch size or ``save_every``; a resume file of another run, or a
            dataset whose first batches differ from those it read; a dataset with no batch; the
            analysis's own refusals (each names its reason).
    """
    check_int_range("save_every", save_every, 1)
    total = n_batches(data, batch_size)
    rank, size = world()
    path = None if resume is None else rank_path(resume, rank, size)
    # what a resume file and the other ranks must match (not needed by one process without a file)
    fp = (fingerprint(analysis.name, {**analysis.options, "kind": kind}, model, data, batch_size, size)
          if path or size > 1 else {})
    sums, done, digest = Sums(), 0, None
    if path is not None and path.exists():
        sums, done, digest = load(path, fp, rank)
    mine = None if total is None else total // size + (rank < total % size)
    desc = analysis.name + (f" (rank 0 of {size})" if size > 1 else "")
    # One batch to run: a bar over batches would sit at 0/1 for the whole run, so the helper draws its
    # own over its passes (or circuits) instead, with an estimate that moves.
    inner = progress and rank == 0 and mine == 1 and done == 0
    progress_bar = bar(desc=desc, enabled=progress and rank == 0 and not inner, total=mine, unit="batch")
    progress_bar.update(min(done, mine or done))
    h, i, saved = new_digest(), 0, done
    token = _INNER_BARS.set(inner)
    try:
        for batch in batches(data, batch_size, rank=rank, world=size, kind=kind):
            if i < done:  # read before the interruption: check it is the same batch, skip it
                batch_digest(h, batch)
                i += 1
                if i == done and h.hexdigest() != digest:
                    raise ValueError(f"{path}: this dataset's first {done} batches (of rank {rank}) are not the ones "
                                     "the interrupted run read; delete the file or pass the same dataset")
                continue
            sums.add(*analysis.parts(analysis.run(model, batch), batch))
            batch_digest(h, batch)
            i += 1
            progress_bar.update(1)
            if path is not None and i - saved >= save_every:
                save(path, sums, done=i, digest=h.hexdigest(), fingerprint=fp, rank=rank)
                saved = i
    finally:
        _INNER_BARS.reset(token)
        progress_bar.close()
    if i < done:
        raise ValueError(f"{path} has read {done} batches of rank {rank}, but this dataset gives it only {i}")
    if path is not None and saved != i:
        save(path, sums, done=i, digest=h.hexdigest(), fingerprint=fp, rank=rank)
    if size > 1:
        sums = reduce(sums, fp)
    if sums.batches == 0:
        raise ValueError("the dataset holds no batch")
    return analysis.build(sums.totals, sums.fixed, model)


def quiet(helper: Callable) -> dict[str, Any]:
    """``{"progress": False}`` for a helper that draws its own bar (the streamed call draws one over the
    batches); ``{"progress": True}`` where the streamed call has one batch to run and leaves the bar to
    the helper (its passes: :func:`stream`); ``{}`` for a helper without one."""
    import inspect

    return {"progress": _INNER_BARS.get()} if "progress" in inspect.signature(helper).parameters else {}


def weight_of(batch: Batch, what: str) -> float:
    """The batch's weight, for an analysis that measures its metric.

    Raises:
        ValueError: the batch has no metric (naming what it needs).
    """
    if batch.metric is None or batch.weight is None:
        raise ValueError(f"{what} measures a metric, and this batch has none: give each Batch metric= with weight=, "
                         "scores= (one score per row) or targets= (the next-token loss)")
    return batch.weight


def no_overrides(options: Mapping[str, Any], helper: str, takes: Iterable[str] = ()) -> None:
    """Refuse options that the dataset provides (tokens, reference, a metric), naming why.

    Raises:
        ValueError: ``metric=`` (a bare metric has no weight: it cannot be combined over batches
            exactly), ``tokens=`` or ``reference=`` (the dataset's), or ``progress``-like inner options.
    """
    if "metric" in options:
        raise ValueError(f"{helper}: the streamed helpers take no metric=: a metric given as a bare function does not "
                         "say what it averages over, so no sum over batches reproduces it exactly. A Task carries its "
                         "own (kind= picks it); a Batch takes metric= with weight=, scores= (one score per row) or "
                         "targets= (next-token loss)")
    for name in ("tokens", "reference", "targets", "contrast"):
        if name in options and name not in takes:
            raise ValueError(f"{helper}: {name}= comes from the dataset (each batch's), not from an option")
