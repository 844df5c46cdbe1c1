"""Resample-ablation scan of every head of a GPT-2-small-shaped model (random weights): rs_interp
vs TransformerLens's ``patching.get_act_patch_attn_head_out_all_pos`` (one full forward pass per
head), side by side in one run, each in its own subprocess so that each peak RSS is its own.

Both compute the same numbers (checked here, and to 1e-4 in the tests): TL patches ``z`` from a
"clean" cache into a "corrupted" run; we pass the reference run as TL's clean cache. The metric reads
the last position, so rs_interp is told so (``positions=[-1]``) and unembeds only there.

Usage: python benchmarks/bench_head_ablation.py [--sizes 2x24 8x64]
Goal (issue 15): at least 2x faster than TransformerLens, same numbers.
"""

from __future__ import annotations

import argparse

from _child import GPT2_SETUP, run_child

_SETUP = "\nfrom transformer_lens import patching\n" + GPT2_SETUP

_BODY = r"""
if tool == "ours":
    values = ri.head_ablation_scan(model, tokens, metric, ablation="resample", reference=reference, positions=[-1]).ablated
else:
    _, cache = model.run_with_cache(reference, names_filter=lambda n: n.endswith("hook_z"))
    values = patching.get_act_patch_attn_head_out_all_pos(model, tokens, cache, metric)
out = {"values": values.double().flatten().tolist()}
"""


def _run(tool: str, batch: int, pos: int) -> dict:
    return run_child(_SETUP, _BODY, tool, batch, pos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["2x24", "8x64"], help="batch x pos pairs")
    args = ap.parse_args()
    print(f"{'size':>6}  {'tool':<16}  {'seconds':>8}  {'peak extra':>10}")
    for size in args.sizes:
        batch, pos = (int(x) for x in size.split("x"))
        ours, tl = _run("ours", batch, pos), _run("transformer_lens", batch, pos)
        diff = max(abs(a - b) for a, b in zip(ours["values"], tl["values"]))
        for name, r in (("rs_interp", ours), ("TransformerLens", tl)):
            print(f"{size:>6}  {name:<16}  {r['seconds']:8.2f}  {r['peak_extra_bytes'] / 2**30:8.2f} GB")
        print(f"{size:>6}  ratio {tl['seconds'] / ours['seconds']:.2f}x faster; max |difference| {diff:.2e}")


if __name__ == "__main__":
    main()
