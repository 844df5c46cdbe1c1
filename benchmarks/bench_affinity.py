"""OQ, OK and OV head subspace affinities (projection kernels) on a GPT-2-small-shaped model, side by side.

Compares, in one run on the same random weights (``ri.load_gpt2("random")``, float32, 12 x 12 heads of 64
in 768 dimensions):
  ours        rs_interp.head_affinities (every head's basis by one batched QR, every pair's kernel as the
              inner product of the two projections, only the earlier/later pairs), all three at once, and
              rs_interp.head_affinity one input at a time
  TL          TransformerLens 4.3's attention_head_subspace_affinity (an SVD per head, every pair's
              ||U^T V||_F^2 of both orders), once per input role
and checks both give the same kernels (max |difference| on TransformerLens's valid pairs). The certificate
is measured before the timings (once per model, cached on it; about as long as one call here).

Usage: python benchmarks/bench_affinity.py [--repeats 2]   (TransformerLens 4.3 only)
Goal (issue 63): all three affinities >= 3x faster than TransformerLens's three calls.
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch
from _child import best_of

import rs_interp as ri
from rs_interp.heads.affinity import head_affinities, head_affinity


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per row (the best is kept)")
    args = ap.parse_args()
    if ri._backend.TL_MAJOR < 4:
        raise SystemExit("TransformerLens 4.3's attention_head_subspace_affinity is the baseline: run under 4.x")
    tl = importlib.import_module("transformer_lens.tools.analysis.projection_kernel")
    torch.set_grad_enabled(False)
    model = ri.load_gpt2("random")
    ri.certify(model)
    print(f"GPT-2-small-shaped model, random weights; torch threads = {torch.get_num_threads()}; "
          f"load average {os.getloadavg()[0]:.1f}")
    ours_all, mine = best_of(lambda: head_affinities(model), args.repeats)
    ours_one, _ = best_of(lambda: [head_affinity(model, w) for w in "qkv"], args.repeats)
    theirs_all, theirs = best_of(lambda: {w: tl.attention_head_subspace_affinity(model, target_role=w.upper())
                                        for w in "qkv"}, args.repeats)
    gap = max(float((mine[w].scores[t.valid_mask] - t.scores[t.valid_mask]).abs().max()) for w, t in theirs.items())
    print(f"max |ours - TL| over the valid pairs (kernels up to 64, float32): {gap:.2e}")
    print(f"{'method':52s} {'seconds (OQ+OK+OV)':>18s}")
    print(f"{'rs_interp head_affinities (all three at once)':52s} {ours_all:18.2f}")
    print(f"{'rs_interp head_affinity, one call per input':52s} {ours_one:18.2f}")
    print(f"{'TransformerLens attention_head_subspace_affinity x3':52s} {theirs_all:18.2f}")
    print(f"speed-up: all three {theirs_all / ours_all:.1f}x (goal >= 3x); one call per input {theirs_all / ours_one:.1f}x")


if __name__ == "__main__":
    main()
