"""Data parallelism on ``torch.distributed``: which rank this is, where its model lives, one reduction.

Under ``torchrun`` (``WORLD_SIZE`` > 1) :func:`world` joins the process group (NCCL where CUDA is,
else Gloo; or the group the caller already initialised), each rank reads its shard of the batches
(:func:`rs_interp.scale.pairs.batches`: batch ``k`` on rank ``k mod world``), and :func:`reduce` sums
every rank's float64 totals with **one** ``all_reduce``, after one ``all_gather_object`` of what each
rank ran (its fingerprint, the shapes and fixed fields of its sums), which must agree: a rank given
another model, dataset or option is refused, naming the rank, instead of being summed in. Every rank
then builds the same result. With one rank, or outside ``torchrun``, nothing here initialises
``torch.distributed``.

A rank's model lives on :func:`rank_device` (``cuda:LOCAL_RANK`` when there is CUDA); a model too big
for one GPU spans :func:`rank_gpus` (TransformerLens 4's ``device_map`` with a ``max_memory`` on those
GPUs: ``docs/capabilities/scale.md``).

>>> world()   # outside torchrun: rank 0 of 1, and torch.distributed untouched
(0, 1)
"""

from __future__ import annotations

import atexit
import os

import torch

from .._messages import few
from .sums import Sums, from_json, to_json

__all__ = ["world", "rank_device", "rank_gpus", "reduce"]


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"the environment's {name}={text!r} is not an integer (torchrun sets it)") from None


def _close() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: the initialised process group's, else torchrun's
    (``WORLD_SIZE`` > 1: the group is initialised here, NCCL on CUDA and Gloo otherwise, and
    destroyed at exit), else ``(0, 1)`` with ``torch.distributed`` left uninitialised.

    Raises:
        ValueError: ``WORLD_SIZE`` > 1 where this torch has no ``torch.distributed``.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if _env_int("WORLD_SIZE", 1) <= 1:
        return 0, 1
    if not dist.is_available():
        raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} (torchrun), but this torch build has no "
                         "torch.distributed")
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    if cuda:
        torch.cuda.set_device(rank_device())
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun's env: MASTER_ADDR/PORT, RANK, WORLD_SIZE
    atexit.register(_close)
    return dist.get_rank(), dist.get_world_size()


def rank_device() -> torch.device:
    """Where this rank's model lives: ``cuda:LOCAL_RANK`` when there is CUDA, else the CPU.

    >>> rank_device() if not torch.cuda.is_available() else torch.device("cpu")
    device(type='cpu')
    """
    if torch.cuda.is_available():
        return torch.device("cuda", _env_int("LOCAL_RANK", 0) % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


def rank_gpus(per_rank: int) -> list[int]:
    """The GPU indices of this rank when each rank's model spans ``per_rank`` GPUs: ``LOCAL_RANK *
    per_rank`` onwards (run ``torchrun --nproc_per_node=G // per_rank`` on a node of ``G`` GPUs).

    Raises:
        ValueError: ``per_rank`` not a positive int, or the node has too few GPUs for this rank.

    >>> rank_gpus(2) if "LOCAL_RANK" not in os.environ else [0, 1]   # rank 0 (LOCAL_RANK unset)
    [0, 1]
    """
    if isinstance(per_rank, bool) or not isinstance(per_rank, int) or per_rank < 1:
        raise ValueError(f"per_rank must be a positive int, got {per_rank!r}")
    first = _env_int("LOCAL_RANK", 0) * per_rank
    gpus = list(range(first, first + per_rank))
    have = torch.cuda.device_count() if torch.cuda.is_available() else None
    if have is not None and gpus[-1] >= have:
        raise ValueError(f"local rank {first // per_rank} needs GPUs {gpus}, but this node has {have}: run "
                         f"torchrun --nproc_per_node={have // per_rank} or fewer")
    return gpus


def reduce(sums: Sums, fingerprint: dict[str, str]) -> Sums:
    """Every rank's ``sums`` added (the same totals on every rank), in one ``all_reduce``.

    Raises:
        ValueError: a rank ran another analysis, model, dataset, batch size or option (its
            fingerprint differs), or its batches disagree with the others' on a fixed field or a shape.
    """
    import torch.distributed as dist

    size = dist.get_world_size()
    mine = {"fingerprint": fingerprint, "shapes": {k: list(v.shape) for k, v in sums.totals.items()},
            "fixed": to_json(sums.fixed), "batches": sums.batches}
    every: list = [None] * size
    dist.all_gather_object(every, mine)
    for r, theirs in enumerate(every):
        differ = [k for k in sorted(fingerprint) if theirs["fingerprint"].get(k) != fingerprint[k]]
        if differ:
            raise ValueError(f"rank {r} ran another {few(differ, show=str)} than rank {dist.get_rank()}: the ranks "
                             "of one streamed call must run the same analysis on the same model and dataset")
    have = [(r, o) for r, o in enumerate(every) if o["batches"]]
    if not have:
        return Sums()
    shapes, fixed = have[0][1]["shapes"], from_json(have[0][1]["fixed"])
    for r, theirs in have:
        if theirs["shapes"] != shapes:
            raise ValueError(f"rank {r}'s sums have shapes {theirs['shapes']}, rank {have[0][0]}'s {shapes}")
        Sums.check(fixed, from_json(theirs["fixed"]), f"rank {r}")
    names = sorted(shapes)
    pieces = [sums.totals[n] if n in sums.totals else torch.zeros(shapes[n], dtype=torch.float64) for n in names]
    flat = torch.cat([p.flatten() for p in pieces] + [torch.tensor([float(sums.batches)], dtype=torch.float64)])
    device = rank_device() if dist.get_backend() == "nccl" else torch.device("cpu")
    flat = flat.to(device)
    dist.all_reduce(flat)  # sum
    flat = flat.cpu()
    totals, i = {}, 0
    for n in names:
        k = int(torch.Size(shapes[n]).numel())
        totals[n] = flat[i : i + k].reshape(shapes[n]).clone()
        i += k
    return Sums(totals, fixed, int(flat[-1]))
