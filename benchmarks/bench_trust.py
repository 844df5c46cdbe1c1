"""Issue 44's options on a GPT-2-small-shaped model (random weights): plain EAP beside the QK fix, AtP*
(QK fix and GradDrop), the Hessian correction (one point and two), Gauss-Legendre EAP-IG (two points)
and per-pair shares, each in its own subprocess: seconds, peak memory, and the matmul FLOPs it runs
(counted by PyTorch, in forward passes over the batch) beside EAP's. ACDC and exact path patching
cost one pass per edge (tens of thousands on GPT-2 small): see bench_attribution_patching.py's scan.

Usage: python benchmarks/bench_trust.py [--batch 1] [--pos 64]
"""

from __future__ import annotations

import argparse

from _child import GPT2_SETUP as _SETUP
from _child import run_child

OPTIONS = {
    "EAP": {},
    "EAP, per-pair shares": {"per_example": True},
    "EAP, QK fix": {"qk_fix": True},
    "AtP* (QK fix, GradDrop)": {"qk_fix": True, "grad_drop": True},
    "EAP, Hessian-corrected": {"correction": "hessian"},
    "EAP-IG, Hessian-corrected (m = 2)": {"correction": "hessian", "ig_steps": 2},
    "EAP-IG, Gauss-Legendre (m = 2)": {"ig_steps": 2, "ig_rule": "gauss"},
}

_BODY = r"""
import ast
from torch.utils.flop_counter import FlopCounterMode
options = ast.literal_eval(sys.argv[4])
torch.set_grad_enabled(True)
values = ri.edge_attribution_patching(model, tokens, metric, reference=reference, **options).effect
seconds = time.perf_counter() - t
with FlopCounterMode(display=False) as counter:
    ri.edge_attribution_patching(model, tokens, metric, reference=reference, **options)
with FlopCounterMode(display=False) as forward:
    model(tokens)
out = {"shape": list(values.shape), "passes": counter.get_total_flops() / forward.get_total_flops(), "call_seconds": seconds}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pos", type=int, default=64)
    args = ap.parse_args()
    print(f"{'estimate':<36}  {'seconds':>8}  {'peak extra':>10}  {'passes':>7}  {'x EAP':>6}")
    base = None
    for name, options in OPTIONS.items():
        r = run_child(_SETUP, _BODY, "edge", args.batch, args.pos, repr(options))
        base = base or r["passes"]
        print(f"{name:<36}  {r['call_seconds']:8.2f}  {r['peak_extra_bytes'] / 2**30:8.2f} GB  {r['passes']:7.1f}  {r['passes'] / base:6.2f}")


if __name__ == "__main__":
    main()
