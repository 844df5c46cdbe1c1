"""Resume files: a streamed run's partial sums and position, written at intervals, read back to finish.

A file holds the float64 totals of the batches read so far (:class:`~rs_interp.scale.sums.Sums`),
the fields they agreed on, how many of this rank's batches were read, a sha256 of those batches'
data, and a **fingerprint** of the run: the analysis and its options, the model (its shape, dtype
and a float64 sum of its embedding and unembedding), the dataset (a Task's digest), the batch size,
the rank and the number of ranks. Resuming from a file whose fingerprint differs is refused, naming
what differs; so is a dataset whose first batches are not the ones the file read. The file is
replaced whole (written beside, then renamed): a run killed while writing leaves the previous one.

Under ``torchrun`` each rank keeps its own file, ``NAME.rank{r}-of-{w}.SUFFIX`` (:func:`rank_path`).

>>> rank_path("run.safetensors", 1, 2).name
'run.rank1-of-2.safetensors'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from .._files import FileError, parsing, read_safetensors, safetensors_metadata
from .._messages import clip, few
from ..tasks.task import Task
from .sums import Sums, from_json, to_json

__all__ = ["fingerprint", "rank_path", "save", "load"]

_FORMAT = "rs_interp.scale resume 1"


def _describe(value: Any, h: Any) -> None:
    """Feed a canonical description of an option's value into the hash ``h`` (tensors by their bytes,
    dataclasses field by field)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor{tuple(t.shape)}{t.dtype}".encode() + t.numpy().tobytes())
    elif isinstance(value, torch.nn.Module):  # e.g. a tuned lens: its weights
        h.update(type(value).__name__.encode())
        _describe(dict(value.state_dict()), h)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(type(value).__name__.encode())
        for f in dataclasses.fields(value):
            h.update(f.name.encode())
            _describe(getattr(value, f.name), h)
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"{k!s}:".encode())
            _describe(value[k], h)
    elif isinstance(value, (list, tuple, set, frozenset)):
        h.update(f"{type(value).__name__}[{len(value)}]".encode())
        for x in (sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value):
            _describe(x, h)
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode())


def fingerprint(analysis: str, options: dict, model: Any, data: Any, batch_size: int | None,
                world: int) -> dict[str, str]:
    """What a resume file must match (module docstring), as strings; every rank of a run gives the same."""
    h = hashlib.sha256()
    _describe(options, h)
    cfg = model.cfg
    with torch.no_grad():
        sums = [float(w.sum(dtype=torch.float64)) for w in (model.W_E, model.W_U)]
    shape = {k: str(getattr(cfg, k, None))
             for k in ("model_name", "n_layers", "d_model", "n_heads", "d_vocab", "attn_only", "dtype")}
    return {"analysis": analysis, "options": h.hexdigest(),
            "model": json.dumps({**shape, "W_E, W_U sums": [f"{s:.17g}" for s in sums]}),
            "data": data.digest() if isinstance(data, Task) else "an iterable of batches (checked batch by batch)",
            "batch_size": str(batch_size), "world": str(world)}


def rank_path(path: str | os.PathLike, rank: int, world: int) -> Path:
    """The resume file of ``rank`` among ``world`` ranks: ``path`` itself for one rank."""
    path = Path(path)
    return path if world == 1 else path.with_name(f"{path.stem}.rank{rank}-of-{world}{path.suffix}")


def save(path: Path, sums: Sums, *, done: int, digest: str, fingerprint: dict[str, str], rank: int) -> None:
    """Write the run's state to ``path`` (written beside, then renamed over it)."""
    from safetensors.torch import save_file

    meta = {"format": _FORMAT, "fingerprint": json.dumps({**fingerprint, "rank": str(rank)}, sort_keys=True),
            "done": str(done), "digest": digest, "fixed": to_json(sums.fixed), "batches": str(sums.batches)}
    tmp = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sums.totals.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load(path: Path, fingerprint: dict[str, str], rank: int) -> tuple[Sums, int, str]:
    """``(sums, done, digest)`` from the file at ``path``, written by the same run.

    Raises:
        rs_interp.FileError: (a ``ValueError``) the file missing, truncated or not a resume file.
        ValueError: one written by another run (the differing items named).
    """
    meta = safetensors_metadata(path, "resume file")
    totals = read_safetensors(path, "resume file")
    if meta.get("format") != _FORMAT:
        raise FileError(f"resume file {path} is not an rs_interp.scale resume file.", path)
    with parsing(path, "resume file"):
        theirs = dict(json.loads(meta["fingerprint"]))
        sums = Sums(totals, from_json(meta["fixed"]), int(meta["batches"]))
        done, digest = int(meta["done"]), meta["digest"]
    mine = {**fingerprint, "rank": str(rank)}
    differ = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    if differ:
        k = differ[0]
        raise ValueError(f"resume file {path} was written by another run: {few(differ, show=str)} differ (e.g. "
                         f"{k}: file {clip(theirs.get(k), 60)!r}, this run {clip(mine.get(k), 60)!r}). Delete it, or "
                         "pass another resume= path.")
    return sums, done, digest
