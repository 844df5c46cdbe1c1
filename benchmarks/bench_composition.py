"""All-pairs K, Q and V composition scores on a GPT-2-small-shaped model, side by side.

Compares, in one run on the same random weights:
  ours        rs_interp.composition_scores (batched low-rank factors), theory and full-circuit variants
  TL          HookedTransformer.all_composition_scores (FactoredMatrix SVDs, broadcast)
  loop        the per-pair FactoredMatrix loop that tutorials use, timed on a subset and extrapolated

Usage: python benchmarks/bench_composition.py [--loop-pairs 40]
Goals (issue 3): >= 10x faster than TL, >= 50x faster than the loop, < 3 s for all three kinds on 2 cores.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

import rs_interp as ri


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loop-pairs", type=int, default=40, help="pairs per kind timed for the per-pair loop")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = ri.load_gpt2("random")
    print(f"GPT-2-small-shaped model, random weights; torch threads = {torch.get_num_threads()}")

    ours_theory, _ = _timed(lambda: [ri.composition_scores(model, k) for k in "kqv"])
    ours_full, ours = _timed(lambda: {k.upper(): ri.composition_scores(model, k, full_circuit=True).scores for k in "kqv"})
    tl_time, agree = 0.0, 0.0
    for k in "KQV":  # one kind at a time: TransformerLens peaks near 10 GB per kind here
        t, theirs = _timed(lambda: model.all_composition_scores(k))
        tl_time += t
        upper = ~ours[k].isnan()
        agree = max(agree, float((ours[k][upper] - theirs[upper]).abs().max()))
        del theirs
        gc.collect()

    L, H = model.cfg.n_layers, model.cfg.n_heads
    pairs = [(l1, h1, l2, h2) for l1 in range(L) for h1 in range(H) for l2 in range(l1 + 1, L) for h2 in range(H)]
    sample = pairs[:: max(1, len(pairs) // args.loop_pairs)][: args.loop_pairs]

    def loop(kind):
        for l1, h1, l2, h2 in sample:
            a = model.OV[l1, h1]
            b = {"K": model.QK[l2, h2].T, "Q": model.QK[l2, h2], "V": model.OV[l2, h2]}[kind]
            _ = (a @ b).norm() / (a.norm() * b.norm())

    loop_sample, _ = _timed(lambda: [loop(k) for k in "KQV"])
    loop_time = loop_sample / len(sample) * len(pairs)

    print(f"pairs per kind: {len(pairs)}; max |ours(full_circuit) - TL| = {agree:.2e}")
    print(f"{'method':44s} {'seconds (K+Q+V)':>16s}")
    print(f"{'rs_interp, theory definition':44s} {ours_theory:16.2f}")
    print(f"{'rs_interp, full circuit (= TL variant)':44s} {ours_full:16.2f}")
    print(f"{'TransformerLens all_composition_scores':44s} {tl_time:16.2f}")
    print(f"{'per-pair FactoredMatrix loop (extrapolated)':44s} {loop_time:16.2f}   ({len(sample)} pairs/kind timed)")
    worst = max(ours_theory, ours_full)
    print(f"speed-up vs TL: {tl_time / worst:.1f}x (goal >= 10x); vs loop: {loop_time / worst:.0f}x (goal >= 50x); "
          f"slowest of ours {worst:.2f} s (goal < 3 s)")


if __name__ == "__main__":
    main()
