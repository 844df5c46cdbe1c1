"""The certificate's cost and what a first call costs (issue 64), as ratios measured side by side in one run.

Parts (``--parts``, default all three):

- ``small``: GPT-2 small's shape (random weights, ``ri.load_gpt2("random")``), in this process, on the threads
  the environment gives (run it with ``OMP_NUM_THREADS=1``): a forward pass of 8 x 64 tokens without
  gradients timed before and after each measurement, and the certificate's first measurement (the model's
  cached certificate dropped first) in units of that forward pass: for ``certify(model)``'s whole table and
  for typical helpers' first calls (the time spent in the certificate inside the helper's own call); then
  ``composition_scores(model, "k")``'s first call against its cached call. The median of ``--reps``.
- ``sizes``: GPT-2 small, medium, large and xl (``--sizes``), each in its own subprocess: ``certify(model)``'s
  first measurement and a forward pass of 8 x 64 tokens timed in that process (CPU seconds: one thread, so
  the process's own work whatever the load), their ratio, the seconds per layer, and the process's peak memory (xl: 1.5 B parameters, 6.2 GB in float32).
- ``tl``: first calls beside TransformerLens's on the same inputs: ``benchmarks/bench_tl_tools.py``'s rows
  ``node`` (node attribution patching against ``attribution_patch``) and ``composition`` (K, Q and V
  composition of every pair against ``all_composition_scores``), each side in a fresh subprocess, its first
  call and a warm one.

What the issue asks of it: the certificate's first measurement at most 1 forward pass (typical helper and the
whole table), the weights-only helper's first call at most 1.5 x its cached call, the certificate's cost growing
no faster than the depth, first calls at least 3x TransformerLens's ``attribution_patch`` and 30x
``all_composition_scores``. On a shared machine the seconds are the load's (the load average is printed); the
ratios are measured side by side in one process.

Usage: OMP_NUM_THREADS=1 python benchmarks/bench_certificate.py [--parts small sizes tl]
    [--sizes small medium large xl] [--reps 3] [--helpers attribution_patching ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Typical helpers' first calls on GPT-2 small: (name, call(model, tokens, reference, metric)).
HELPERS = {
    "attribution_patching": lambda ri, m, t, r, f: ri.attribution_patching(m, t, f, reference=r),
    "edge_attribution_patching": lambda ri, m, t, r, f: ri.edge_attribution_patching(m, t, f, reference=r),
    "composition_scores (k)": lambda ri, m, t, r, f: ri.composition_scores(m, "k"),
    "direct_logit_attribution": lambda ri, m, t, r, f: ri.direct_logit_attribution(m, t, targets=r),
    "logit_lens": lambda ri, m, t, r, f: ri.logit_lens(m, t),
    "attention_patterns": lambda ri, m, t, r, f: ri.attention_patterns(m, t),
    "path_patching (3 edges)": lambda ri, m, t, r, f: ri.path_patching(
        m, t, f, reference=r, edges=[("L9H1", "L10H0.q"), ("L9H1", "logits"), ("MLP10", "logits")], progress=False),
}


class _Timed:
    """The seconds spent in the certificate's measuring function (``_measured``; ``certify`` before issue 64)."""

    def __init__(self) -> None:
        from rs_interp.exact import certificate

        self.module, self.seconds = certificate, 0.0
        self.name = "_measured" if hasattr(certificate, "_measured") else "certify"
        self.real = getattr(certificate, self.name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return self.real(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(certificate, self.name, timed)


def _small(reps: int, helpers: list[str] | None = None) -> dict:
    import torch

    import rs_interp as ri

    model = ri.load_gpt2("random")
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, model.cfg.d_vocab, (8, 64), generator=g)
    tokens, reference = (torch.randint(0, model.cfg.d_vocab, (4, 16), generator=g) for _ in range(2))
    metric = lambda logits: logits[:, -1, 42].mean() - logits[:, -1, 43].mean()  # noqa: E731

    def forward() -> float:
        with torch.no_grad():
            start = time.perf_counter()
            model(batch)
            return time.perf_counter() - start

    def fresh() -> None:
        model.__dict__.pop("_rs_interp_certificate", None)

    forward()
    timer = _Timed()
    calls = {"certify(model): the whole table": lambda: ri.certify(model)}
    calls |= {name: (lambda fn=fn: fn(ri, model, tokens, reference, metric)) for name, fn in HELPERS.items()
              if helpers is None or name.split()[0] in helpers}
    out: dict = {"forwards": {}, "seconds": {}}
    for name, call in calls.items():
        ratios, seconds = [], []
        for _ in range(reps):
            fresh()
            before = forward()
            timer.seconds = 0.0
            call()
            after = forward()
            ratios.append(timer.seconds / ((before + after) / 2))
            seconds.append(timer.seconds)
        out["forwards"][name], out["seconds"][name] = statistics.median(ratios), statistics.median(seconds)
        print(f"  {name:<44} {statistics.median(seconds):6.2f} s = {statistics.median(ratios):5.2f} forwards "
              f"(each rep: {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    firsts, cached = [], []
    for _ in range(reps):
        fresh()
        start = time.perf_counter()
        ri.composition_scores(model, "k")
        firsts.append(time.perf_counter() - start)
        start = time.perf_counter()
        ri.composition_scores(model, "k")
        cached.append(time.perf_counter() - start)
    ratio = statistics.median(f / c for f, c in zip(firsts, cached))
    out["composition first / cached"] = ratio
    first, again = statistics.median(firsts), statistics.median(cached)
    print(f"  composition_scores(model, 'k'): first {first:.2f} s, cached {again:.2f} s, "
          f"first / cached {ratio:.2f} (target <= 1.5)", flush=True)
    return out


_SIZE_CHILD = r"""
import json, resource, sys, time, torch
import rs_interp as ri
size = sys.argv[1]
start = time.process_time()
model = ri.load_gpt2("random", size=size)
load = time.process_time() - start
batch = torch.randint(0, model.cfg.d_vocab, (8, 64), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(batch[:1, :8])  # kernels warmed up: the forward below is the batch's own
    start = time.process_time()
    model(batch)
    forward = time.process_time() - start
start = time.process_time()
cert = ri.certify(model)
first = time.process_time() - start
start = time.process_time()
ri.certify(model)
cached = time.process_time() - start
print(json.dumps({"layers": model.cfg.n_layers, "params": sum(p.numel() for p in model.parameters()), "load": load,
                  "forward": forward, "certify": first, "cached": cached, "failed": list(cert.failed()),
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _sizes(sizes: list[str]) -> dict:
    out = {}
    for size in sizes:
        done = subprocess.run([sys.executable, "-c", _SIZE_CHILD, size], capture_output=True, text=True)
        if done.returncode:
            why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode
            print(f"  {size}: failed ({why})", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        out[size] = r
        print(f"  {size:<7} {r['layers']:>3} layers {r['params'] / 1e9:5.2f} B params: certify {r['certify']:7.2f} s "
              f"({r['certify'] / r['layers']:.3f} s a layer; cached {r['cached']:.2f} s), "
              f"forward 8 x 64 {r['forward']:7.2f} s, certify / forward {r['certify'] / r['forward']:.2f}; "
              f"peak {r['peak'] / 2**30:.1f} GiB; failed {r['failed']}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["small", "sizes", "tl"], choices=["small", "sizes", "tl"])
    ap.add_argument("--sizes", nargs="+", default=["small", "medium", "large", "xl"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--helpers", nargs="*", default=None, help="the helpers timed in 'small' (default all of HELPERS; "
                    "by their first word, e.g. attribution_patching composition_scores; none: the whole table only)")
    args = ap.parse_args()
    import torch

    from rs_interp._backend import TL_VERSION

    print(f"TransformerLens {TL_VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    if "small" in args.parts:
        print("GPT-2 small's shape: the certificate's first measurement, in forward passes of 8 x 64 tokens (no grad)")
        _small(args.reps, args.helpers)
    if "sizes" in args.parts:
        print("The whole certificate's first measurement on GPT-2's sizes (random weights), each in its own process")
        _sizes(args.sizes)
    if "tl" in args.parts:
        print("First calls beside TransformerLens's (bench_tl_tools.py --rows node composition)", flush=True)
        subprocess.run([sys.executable, str(HERE / "bench_tl_tools.py"), "--rows", "node", "composition"], check=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
