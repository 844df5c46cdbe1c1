"""Streaming, resuming and data parallelism (rs_interp.scale, issue #45) on code-2l (float32, the
induction task): peak memory over 1x and 10x the pairs (bounded by one batch, not the dataset); the
streamed call's time beside one call on the same pairs (the streaming's overhead: the helpers' own
bound is benchmarks/run_all.py's); and wall time under ``torchrun`` with 1 and 2 ranks (Gloo, CPU).
Each measurement in its own process; the memory ones with glibc's mmap threshold fixed at 1 MB
(``_memory`` says why).

Usage: python benchmarks/bench_streaming.py [--pairs 64] [--batch 32] [--seq 64] [--ranks 1 2] [--skip memory overhead ranks]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _child import run_child

_SETUP = r"""
tool, n, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
from rs_interp import scale
from rs_interp.tasks import induction_task
model = ri.load_toy_model("code-2l")
task = induction_task(n, seed=0, d_vocab=model.cfg.d_vocab, seq_len=seq, min_period=4, max_period=seq // 3)
first = task.clean[:batch], task.corrupted[:batch]
scores = ri.edge_attribution_patching(model, first[0], lambda lg: lg[:, -1, 0].mean(), reference=first[1])
"""

_BODY = r"""
kw = dict(tokens=task.clean, metric=task.metric(), reference=task.corrupted)
if tool == "eap-ig streamed":
    r = scale.edge_attribution_patching(model, task, batch_size=batch, ig_steps=5, progress=False)
elif tool == "eap-ig one call":
    r = ri.edge_attribution_patching(model, ig_steps=5, **kw)
elif tool == "curve streamed":
    r = scale.faithfulness_curve(model, task, scores, batch_size=batch, progress=False)
elif tool == "curve one call":
    r = ri.faithfulness_curve(model, scores=scores, **kw)
elif tool == "path patching streamed":
    r = scale.path_patching(model, task, batch_size=batch, progress=False)
else:
    r = ri.path_patching(model, **kw)
out = {}
"""

_WORKER = r"""
import json, sys, time, torch
torch.set_num_threads(1)
import rs_interp as ri
from rs_interp import scale
from rs_interp.tasks import induction_task
n, batch, seq = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rank, world = scale.world()
model = ri.load_toy_model("code-2l")
task = induction_task(n, seed=0, d_vocab=model.cfg.d_vocab, seq_len=seq, min_period=4, max_period=seq // 3)
t = time.perf_counter()
scale.edge_attribution_patching(model, task, batch_size=batch, ig_steps=5, progress=False)
if rank == 0:
    print(json.dumps({"world": world, "seconds": time.perf_counter() - t}))
"""


def _memory(pairs: int, batch: int, seq: int) -> None:
    # glibc raises its mmap threshold as large blocks are freed, after which a pass's tensors come from
    # the heap, whose freed blocks fragment and stay counted in the RSS: the peak then drifts up by
    # tens of MB from batch to batch with no tensor alive (checked: the live tensors stay the model's
    # and the dataset's). A fixed threshold gives each large tensor back when freed, so the peak is
    # the largest batch's working set.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))
    print(f"{'streamed (batches of %d)' % batch:<28}  {'pairs':>6}  {'seconds':>8}  {'peak extra':>11}   ({seq} tokens)")
    for tool in ("eap-ig streamed", "curve streamed", "path patching streamed"):
        peaks = []
        for n in (pairs, 10 * pairs):
            r = run_child(_SETUP, _BODY, tool, n, batch, seq)
            peaks.append(r["peak_extra_bytes"])
            print(f"{tool:<28}  {n:>6}  {r['seconds']:8.2f}  {r['peak_extra_bytes'] / 2**20:8.1f} MB")
        print(f"{'':<28}  10x the pairs: peak x {peaks[1] / peaks[0]:.3f}")


def _overhead(pairs: int, batch: int, seq: int) -> None:
    print(f"\n{'helper':<28}  {'one call':>9}  {'streamed':>9}  {'ratio':>6}   ({pairs} pairs, batches of {batch})")
    for tool in ("eap-ig", "curve", "path patching"):
        one, streamed = (run_child(_SETUP, _BODY, f"{tool} {how}", pairs, batch, seq)["seconds"] for how in ("one call", "streamed"))
        print(f"{tool:<28}  {one:8.2f}s  {streamed:8.2f}s  {streamed / one:6.2f}")


def _ranks(pairs: int, batch: int, seq: int, ranks: list[int]) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    script = Path("/tmp") / f"rs_interp_bench_worker_{os.getpid()}.py"
    script.write_text(_WORKER)
    print(f"\n{'EAP-IG (5 steps) under torchrun':<32}  {'compute':>8}  {'wall (with start-up)':>20}   ({pairs} pairs, batches of {batch})")
    try:
        for n in ranks:
            t = time.perf_counter()
            done = subprocess.run([str(torchrun), "--standalone", f"--nproc_per_node={n}", str(script), str(pairs), str(batch), str(seq)],
                                  env=env, capture_output=True, text=True, check=True, timeout=900)
            wall = time.perf_counter() - t
            r = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
            print(f"{f'{n} rank(s)':<32}  {r['seconds']:7.2f}s  {wall:19.2f}s")
    finally:
        script.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64, help="tokens per prompt (code-2l's n_ctx: 64)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip", nargs="*", default=[], choices=["memory", "overhead", "ranks"])
    args = ap.parse_args()
    if "memory" not in args.skip:
        _memory(args.pairs, args.batch, args.seq)
    if "overhead" not in args.skip:
        _overhead(args.pairs, args.batch, args.seq)
    if "ranks" not in args.skip:
        _ranks(10 * args.pairs, args.batch, args.seq, args.ranks)


if __name__ == "__main__":
    main()
