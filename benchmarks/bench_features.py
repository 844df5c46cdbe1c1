"""Attribution graphs (issue 46): time and peak memory of one graph of a 64-token prompt, on code-2l
with its shipped transcoders and on GPT-2 small's shape (random weights) with random TopK transcoders
of a realistic width, each in its own subprocess (its own peak RSS).

Usage: python benchmarks/bench_features.py [--pos 64] [--width 24576] [--k 64] [--max-nodes 1024 7500]
       [--batch 64] [--only code-2l|gpt2]

The GPT-2-shaped run keeps at most ``--max-nodes`` feature nodes (circuit-tracer's CLI keeps 7,500 by
default); each run prints its node counts, the rows computed, seconds and the peak memory above the
loaded model and transcoders (the transcoders' own size is printed beside it). One thread.
circuit-tracer publishes no figure for GPT-2 small; what it does publish is in docs/capabilities/features.md.
"""

from __future__ import annotations

import argparse
import textwrap

from _child import GPT2_RANDOM_TRANSCODERS, run_child

_SETUP = (r"""
from rs_interp.features import Transcoder, TranscoderSet, attribution_graph, shipped_transcoders
torch.set_num_threads(1)
which, pos, width, k, max_nodes, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
max_nodes = None if max_nodes == "all" else int(max_nodes)
g = torch.Generator().manual_seed(0)
if which == "code-2l":
    model, tcs = ri.load_toy_model("code-2l"), shipped_transcoders("code-2l")
    tokens = ri.induction_batch(1, seed=5, d_vocab=model.cfg.d_vocab, seq_len=pos).tokens[0]
else:
"""
          + textwrap.indent(GPT2_RANDOM_TRANSCODERS, "    ") + r"""
tc_bytes = sum(p.numel() * p.element_size() for tc in tcs for p in tc.parameters())
""")

_BODY = r"""
cpu = time.process_time()
graph = attribution_graph(model, tcs, tokens, max_feature_nodes=max_nodes, batch_size=batch)
s = graph.scores()
out = {"active": graph.n_active, "features": graph.n_features, "nodes": graph.n_nodes, "logits": graph.n_logits,
       "transcoder_bytes": tc_bytes, "replacement": s.replacement, "completeness": s.completeness,
       "cpu_seconds": time.process_time() - cpu}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("--width", type=int, default=24576, help="features a layer of the GPT-2-shaped transcoders")
    ap.add_argument("--k", type=int, default=64, help="their TopK's k (active features a token and layer)")
    ap.add_argument("--max-nodes", nargs="+", default=["1024", "7500"], help="feature-node caps of the GPT-2 runs ('all': none)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--only", choices=["code-2l", "gpt2"])
    args = ap.parse_args()
    runs = []
    if args.only in (None, "code-2l"):
        runs.append(("code-2l", "all"))
    if args.only in (None, "gpt2"):
        runs += [("gpt2-small shape", cap) for cap in args.max_nodes]
    print(f"{'model':<17} {'cap':>5} {'active':>7} {'features':>8} {'nodes':>6} {'seconds':>8} {'cpu s':>7} {'peak extra':>10} {'transcoders':>11}"
          f" {'replacement':>11} {'completeness':>12}")
    for which, cap in runs:
        r = run_child(_SETUP, _BODY, "code-2l" if which == "code-2l" else "gpt2", args.pos, args.width, args.k, cap, args.batch)
        print(f"{which:<17} {cap:>5} {r['active']:>7} {r['features']:>8} {r['nodes']:>6} {r['seconds']:8.1f} {r['cpu_seconds']:7.1f} "
              f"{r['peak_extra_bytes'] / 2**30:8.2f} GB {r['transcoder_bytes'] / 2**20:8.0f} MB {r['replacement']:11.3f} "
              f"{r['completeness']:12.3f}", flush=True)


if __name__ == "__main__":
    main()
