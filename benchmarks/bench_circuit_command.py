"""The circuit command (``rs-interp circuit``) on code-2l and on GPT-2 small's shape, for eap and eap-ig at
the default settings: its CPU seconds and peak memory, against what the process holds before any work
(the baseline) and against the bound of its passes.

Every run is a fresh process on one thread (``OMP_NUM_THREADS=1``), its CPU seconds (user + system) and
peak resident memory read from the kernel when it exits (``os.wait4``: what ``/usr/bin/time -v`` reports):

- **the command** as a user runs it: ``python -m rs_interp.ui.cli circuit --model M --task T --method X --out DIR --quiet``;
- **the baseline**: the same imports, the model loaded and the task built, nothing computed (its CPU
  seconds and peak, and its resident memory at the end: what every run of the command holds);
- **the passes**: in a process of their own, one pass of each kind timed on the task's batch (the best
  of two, the first call also warming up the model's certificate): a plain forward pass to the logits
  (``forward``), a forward pass to the last sender and no further (``record``: the reference's writes,
  :func:`rs_interp.circuits._substrate.record`), edge attribution patching's forward and backward pass
  (``gradient``: the helper's time less its ``record``), and each circuit's ablated pass: every distinct
  circuit of the command's curve, chosen from the command's own scores as the curve chooses them
  (``circuit``, their mean), and the circuit at ``--size``.

The command needs: its scores (eap: a record and a gradient pass; eap-ig with ``m`` steps: two records,
``m`` gradient passes, and a forward pass when ``1`` is not among its points), the faithfulness curve (a
record, the clean forward pass, the empty circuit and one pass per distinct circuit of the others), the
circuit at ``--size`` (nothing more when the curve ran it, as at the default 0.01 on GPT-2 small; else a
record and a pass), and the clean and corrupted metrics (two forward passes). **bound** =
those counts times their passes' seconds; **ratio** = (the command's CPU s - the baseline's) / bound: the
rest is choosing the circuits, checking the model and writing the files.

On a shared machine the wall seconds are the load's (the load average is printed first); the CPU
seconds and the memory are the processes' own.

Usage: python benchmarks/bench_circuit_command.py [--models code-2l gpt2-random] [--methods eap eap-ig] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"code-2l": "induction", "gpt2-random": "ioi"}
IG_STEPS = 5  # the command's default --ig-steps

_LOAD = """
import json, sys, time, resource
from rs_interp.ui._circuit_args import load_command_model
from rs_interp.tasks import build_task
import rs_interp.ui.cli, rs_interp.ui.circuit_command
spec, task_name = sys.argv[1], sys.argv[2]
model, tokenizer, _ = load_command_model(spec)
task = build_task(task_name, tokenizer, n=32, seed=0, d_vocab=model.cfg.d_vocab, n_ctx=model.cfg.n_ctx)
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
"""

_BASELINE = _LOAD + """
print(json.dumps({"rss_end": rss}))
"""

_PASSES = _LOAD + """
import math
import torch
from safetensors.torch import load_file
import rs_interp as ri
from rs_interp._state import preserve_state
from rs_interp.circuits._ablated_run import ablated_writes, run_circuit
from rs_interp.circuits.evaluation import MIB_FRACTIONS
from rs_interp.circuits.graph import EdgeEffects
from rs_interp.circuits.selection import circuit_at, mask, prune
from rs_interp.exact.stream import mlp_flags
from rs_interp.scale.pairs import batches

out, size = sys.argv[3], int(sys.argv[4])
b = next(iter(batches(task, len(task))))
layout = ri.edge_layout(model)
scores = EdgeEffects(layout, load_file(out + "/scores.safetensors")["effect"], 0.0)  # the command's own

def best(fn, reps=2):
    best = math.inf
    for _ in range(reps):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best

eap = best(lambda: ri.edge_attribution_patching(model, b.tokens, b.metric, reference=b.reference, progress=False))
keeps = {}  # the curve's distinct circuits, as it chooses them, the empty one first
for keep in [torch.zeros_like(layout.exists)] + [prune(layout, circuit_at(scores, f, pruned=False)) for f in MIB_FRACTIONS]:
    keeps.setdefault(bytes(keep.flatten().tolist()), keep)
chosen = prune(layout, mask(layout, ri.top_edges(scores, size)))
with preserve_state(model, **mlp_flags(model)), torch.no_grad():
    forward = best(lambda: model(b.tokens, return_type="logits"))
    record = best(lambda: ablated_writes(model, b.tokens, b.reference, "resample"))
    ablated = ablated_writes(model, b.tokens, b.reference, "resample")
    run = lambda k: best(lambda: run_circuit(model, b.tokens, b.metric, layout, k, ablated, "circuit"), reps=1)
    circuits = [run(k) for k in keeps.values()]
    at_size = run(chosen)
print(json.dumps({"forward": forward, "record": record, "gradient": eap - record, "circuits": circuits, "at_size": at_size}))
"""


def _child(args: list[str], out_file: Path) -> dict:
    """Run ``python args`` on one thread; its CPU seconds, peak RSS (bytes), wall seconds and last stdout line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with open(out_file, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} ... failed ({proc.returncode}): {out_file.read_text()[-2000:]}")
    lines = out_file.read_text().strip().splitlines()
    return {"cpu": usage.ru_utime + usage.ru_stime, "peak": usage.ru_maxrss * 1024, "wall": wall, "last": lines[-1] if lines else ""}


def _counts(method: str, out: Path) -> dict[str, int]:
    """The passes the command ran, by kind (module docstring): ``circuit`` the curve's (the empty
    circuit and each distinct other), ``at_size`` 1 when the circuit at ``--size`` is not one of them."""
    import inspect

    import rs_interp as ri
    from rs_interp.circuits.correction import quadrature

    curve = json.loads((out / "curve.json").read_text())
    circuit = json.loads((out / "circuit.json").read_text())
    on_curve = any(r == circuit["requested"] and n == circuit["size"] for r, n in zip(curve["n_requested"], curve["n_edges"]))
    if method == "eap":
        scores = {"record": 1, "gradient": 1, "forward": 0}
    else:
        rule = inspect.signature(ri.edge_attribution_patching).parameters["ig_rule"].default
        alphas = quadrature(IG_STEPS, rule, None)[0]
        scores = {"record": 2, "gradient": len(alphas), "forward": 0 if 1.0 in alphas else 1}
    return {"record": scores["record"] + 1 + (0 if on_curve else 1), "gradient": scores["gradient"],
            "forward": scores["forward"] + 1 + 2, "circuit": 1, "at_size": 0 if on_curve else 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--methods", nargs="+", default=["eap", "eap-ig"], choices=["eap", "eap-ig"])
    parser.add_argument("--keep", default=None, help="write the command's files under this folder (default: a temporary one)")
    args = parser.parse_args()
    top = Path(args.keep or tempfile.mkdtemp(prefix="bench_circuit_"))
    top.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores here: wall seconds are the load's)", flush=True)
    rows = []
    for spec in args.models:
        task = TASKS[spec]
        base = _child(["-c", _BASELINE, spec, task], top / f"{spec}.baseline.txt")
        base["rss_end"] = json.loads(base["last"])["rss_end"]
        print(f"{spec}: baseline {base['cpu']:.1f} CPU s, peak {base['peak'] / 1e9:.2f} GB, "
              f"holding {base['rss_end'] / 1e9:.2f} GB", flush=True)
        for method in args.methods:
            out = top / f"{spec}-{method}"
            run = _child(["-m", "rs_interp.ui.cli", "circuit", "--model", spec, "--task", task, "--method", method,
                          "--out", str(out), "--size", "0.01", "--quiet"],  # MIB's size: no bisection
                         top / f"{spec}-{method}.txt")
            requested = json.loads((out / "circuit.json").read_text())["requested"]
            cost = json.loads(_child(["-c", _PASSES, spec, task, str(out), str(requested)], top / f"{spec}-{method}.passes.txt")["last"])
            counts = _counts(method, out)
            counts["circuit"] = len(cost["circuits"])
            per = {**{k: cost[k] for k in ("forward", "record", "gradient", "at_size")}, "circuit": sum(cost["circuits"]) / len(cost["circuits"])}
            bound = sum(counts[k] * per[k] for k in counts)
            rows.append((spec, task, method, run, base, counts, bound))
            print(f"  {method}: {run['cpu']:.1f} CPU s, {run['wall']:.0f} s wall, peak {run['peak'] / 1e9:.2f} GB "
                  f"({(run['peak'] - base['rss_end']) / 1e9:.2f} GB above the baseline's); one pass (CPU s): "
                  + ", ".join(f"{k} {per[k]:.2f}" for k in ("forward", "record", "gradient"))
                  + ", the curve's circuits " + " ".join(f"{c:.1f}" for c in cost["circuits"]) + "; passes "
                  + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                  + f": bound {bound:.1f} CPU s, ratio {(run['cpu'] - base['cpu']) / bound:.2f}", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}\n")
    print("| model, task | method | CPU s | wall s | peak RSS | baseline: CPU s, peak, held | above the baseline | passes | bound | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec, task, method, run, base, counts, bound in rows:
        passes = " + ".join(f"{v} {k}" for k, v in counts.items() if v)
        print(f"| {spec}, {task} | {method} | {run['cpu']:.1f} | {run['wall']:.0f} | {run['peak'] / 1e9:.2f} GB | "
              f"{base['cpu']:.1f}, {base['peak'] / 1e9:.2f} GB, {base['rss_end'] / 1e9:.2f} GB | "
              f"{(run['peak'] - base['rss_end']) / 1e9:.2f} GB | {passes} | {bound:.1f} s | {(run['cpu'] - base['cpu']) / bound:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
