"""Attribution patching on a GPT-2-small-shaped model (random weights): the node estimate (every head)
and the edge estimate (every edge of the graph: embed, heads and MLPs into q/k/v inputs, MLPs and logits), each from one forward and
one backward pass, beside the exact resample scan they approximate. Each tool in its own subprocess.

Usage: python benchmarks/bench_attribution_patching.py [--batch 1] [--pos 64]
"""

from __future__ import annotations

import argparse

from _child import GPT2_SETUP as _SETUP
from _child import run_child

_BODY = r"""
if tool == "node":
    values = ri.attribution_patching(model, tokens, metric, reference=reference).effect
elif tool == "edge":
    values = ri.edge_attribution_patching(model, tokens, metric, reference=reference).effect  # (sender, receiver)
else:
    values = ri.head_ablation_scan(model, tokens, lambda lg: lg[:, 0].log_softmax(-1)[:, 42].mean(), ablation="resample",
                                   reference=reference, positions=[-1]).effect
out = {"shape": list(values.shape)}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pos", type=int, default=64)
    args = ap.parse_args()
    print(f"{'tool':<40}  {'seconds':>8}  {'peak extra':>10}")
    names = {"node": "attribution_patching (144 heads)", "edge": "edge_attribution_patching (all edges)",
             "scan": "head_ablation_scan, resample (exact)"}
    for tool, name in names.items():
        r = run_child(_SETUP, _BODY, tool, args.batch, args.pos)
        print(f"{name:<40}  {r['seconds']:8.2f}  {r['peak_extra_bytes'] / 2**30:8.2f} GB")


if __name__ == "__main__":
    main()
