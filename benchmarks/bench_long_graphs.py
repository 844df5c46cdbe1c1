"""Attribution graphs of long prompts in bounded memory (issue 54 item 2): on GPT-2 small's shape (random
weights) with 12 x 24,576 random TopK transcoders, the graph of a 64- and a 1,024-token prompt, one thread,
each in its own subprocess: the estimate made before the run (:func:`rs_interp.features.estimate_graph`),
then the run (rows kept as :class:`~rs_interp.features._rows.RowMatrix`, ``dense=False``) with its pruning
and scores; seconds, CPU seconds and the peak memory above the loaded model and transcoders (measured from a
heap trimmed of what the setup freed: glibc's ``malloc_trim``), against the estimate and against the bound, the
FLOPs counted over the large-matmul rate measured in the same process.

Usage: python benchmarks/bench_long_graphs.py [--pos 64 1024] [--width 24576] [--k 64] [--max-nodes 1024] [--batch 16]

The 1,024-token graph takes about 16 CPU minutes and 6.7 GB in all: run it alone on a shared machine.
The results, and circuit-tracer's published figures for long prompts, are in docs/project/benchmarks.md.
"""

from __future__ import annotations

import argparse

from _child import GPT2_RANDOM_TRANSCODERS, run_child

_SETUP = (r"""
from rs_interp.features import Transcoder, TranscoderSet, attribution_graph, estimate_graph
from rs_interp.features.estimate import matmul_rate
torch.set_num_threads(1)
pos, width, k, max_nodes, batch = (int(a) for a in sys.argv[1:6])
g = torch.Generator().manual_seed(0)
"""
          + GPT2_RANDOM_TRANSCODERS + r"""
tc_bytes = sum(p.numel() * p.element_size() for tc in tcs for p in tc.parameters())
rate = max(matmul_rate(2048), matmul_rate(2048))
est = estimate_graph(model, tcs, pos, max_feature_nodes=max_nodes, batch_size=batch, dense=False, rate=rate)
# glibc: give back what the setup freed, so the graph reuses none of it (the peak varied 0.12-0.33 GB at 64 tokens)
try:
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
except OSError:
    pass
""")

_BODY = r"""
cpu = time.process_time()
graph = attribution_graph(model, tcs, tokens, max_feature_nodes=max_nodes, batch_size=batch, dense=False)
pruned = graph.prune()
s = graph.scores()
out = {"active": graph.n_active, "features": graph.n_features, "nodes": graph.n_nodes, "kept": pruned.counts(),
       "transcoder_bytes": tc_bytes, "replacement": s.replacement, "completeness": s.completeness,
       "cpu_seconds": time.process_time() - cpu, "rate": rate, "flops": est.flops, "estimate_seconds": est.seconds,
       "estimate_peak": est.peak_bytes, "estimate_parts": est.parts, "dense_bytes": 4 * graph.n_nodes ** 2}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pos", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--width", type=int, default=24576)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--max-nodes", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    print(f"{'tokens':>6} {'active':>8} {'nodes':>6} {'seconds':>8} {'cpu s':>7} {'est s':>6} {'cpu/est':>7} "
          f"{'bound s':>7} {'ratio':>5} {'GFLOP/s':>7} "
          f"{'peak extra':>10} {'estimate':>9} {'est/meas':>8} {'dense would be':>14} {'replacement':>11}")
    for pos in args.pos:
        r = run_child(_SETUP, _BODY, pos, args.width, args.k, args.max_nodes, args.batch)
        bound = r["flops"] / r["rate"]
        print(f"{pos:>6} {r['active']:>8} {r['nodes']:>6} {r['seconds']:8.1f} {r['cpu_seconds']:7.1f} "
              f"{r['estimate_seconds']:6.1f} {r['cpu_seconds'] / r['estimate_seconds']:7.2f} {bound:7.1f} "
              f"{r['cpu_seconds'] / bound:5.2f} {r['rate'] / 1e9:7.0f} {r['peak_extra_bytes'] / 2**30:7.2f} GB "
              f"{r['estimate_peak'] / 2**30:6.2f} GB {r['estimate_peak'] / r['peak_extra_bytes']:8.2f} "
              f"{r['dense_bytes'] / 2**30:11.2f} GB {r['replacement']:11.3f}", flush=True)
        print("   estimate parts (GB):", {k: round(v / 2**30, 3) for k, v in r["estimate_parts"].items() if v}, flush=True)
        print(f"   model + transcoders: transcoders {r['transcoder_bytes'] / 2**30:.2f} GB; kept after pruning {r['kept']}", flush=True)


if __name__ == "__main__":
    main()
