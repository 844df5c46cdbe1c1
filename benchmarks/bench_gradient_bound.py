"""The gradient helpers at the machine's bound on a user-sized batch: node and edge attribution
patching and second-order attribution on GPT-2 small (random weights), ``batch x pos`` tokens
(default 8 x 64), against the large-matmul rate measured in the same run (issue 45 item 5).

Each helper runs in its own subprocess, set up as ``run_all.py`` sets it up (``load_gpt2("random")``,
the unembedding centred, seeded tokens and reference, the metric at the last position; second order
at ``positions=[-2]`` with next-token targets, or every position with ``--all-positions``). There:

- one untimed warm-up call, under ``torch.utils.flop_counter.FlopCounterMode`` for second order (its
  counted matmul FLOPs); for the attribution patching helpers the FLOPs they cannot avoid, counted
  bare as ``run_all.py``'s ``floor_flops`` counts them (the reference's forward to the last activation
  needed, a forward with gradients and a backward to the embedding, plus the contraction with the
  patch directions), followed by one untimed call of the helper itself;
- the large-matmul rate, a float32 ``(2048 x d_model) @ (d_model x 50257)``, best of three;
- the helper's call timed ``--repeats`` times (median);
- the rate again (the better of the two is used: a conservative bound on a shared machine).

``ratio`` = median time / (FLOPs / rate); 1.0 is the machine's limit.

Usage: python benchmarks/bench_gradient_bound.py [--batch 8] [--pos 64] [--helpers node edge second]
       [--repeats 3] [--all-positions] [--profile HELPER]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CODE = r"""
import json, statistics, sys, time, warnings, torch
warnings.filterwarnings("ignore")
import rs_interp as ri
from torch.utils.flop_counter import FlopCounterMode
helper, B, P, repeats, all_positions, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6] == "1"
if int(sys.argv[7]):
    torch.set_num_threads(int(sys.argv[7]))
torch.set_grad_enabled(False)
model = ri.load_gpt2("random", size="small")
ri._backend.set_unembedding(model, model.W_U - model.W_U.mean(-1, keepdim=True))  # as run_all.py
g = torch.Generator().manual_seed(0)
V = model.cfg.d_vocab
tokens = torch.randint(0, V, (B, P), generator=g)
reference = torch.randint(0, V, (B, P), generator=g)
metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 42].mean()
positions = None if all_positions else [-2]

def call():
    if helper == "second":
        return ri.second_order_attribution(model, tokens, targets=ri.next_token_targets(tokens), positions=positions)
    if helper == "node":
        return ri.attribution_patching(model, tokens, metric, reference=reference)
    return ri.edge_attribution_patching(model, tokens, metric, reference=reference)

def floor_flops():  # run_all.py's floor_flops at (B, P)
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    last = f"blocks.{L - 1}.attn.hook_z" if helper == "node" else f"blocks.{L - 1}.hook_mlp_out"
    def stop(t, *, hook):
        raise ri._backend.Stop
    with FlopCounterMode(display=False) as c:
        try:
            with torch.no_grad(), model.hooks(fwd_hooks=[(last, stop)]):
                model(reference, return_type=None)
        except ri._backend.Stop:
            pass
        with torch.enable_grad():
            leaf = torch.zeros((), requires_grad=True)
            with model.hooks(fwd_hooks=[("hook_embed", lambda t, *, hook: t + leaf)]):
                value = metric(model(tokens, return_type="logits"))
            torch.autograd.backward(value, inputs=[leaf])
    contraction = 2 * B * P * L * H * cfg.d_head
    if helper != "node":
        contraction = contraction * cfg.d_model + 2 * B * P * cfg.d_model * int(ri.edge_layout(model).exists.sum())
    return c.get_total_flops() + contraction

def rate():
    a, b = torch.randn(2048, model.cfg.d_model), torch.randn(model.cfg.d_model, 50257)
    a @ b
    best, best_cpu = float("inf"), float("inf")
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time(); a @ b
        best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.process_time() - c)
    return 2 * 2048 * model.cfg.d_model * 50257 / best, 2 * 2048 * model.cfg.d_model * 50257 / best_cpu

if helper == "second":
    with FlopCounterMode(display=False) as c:
        call()
    flops = c.get_total_flops()
else:
    flops = floor_flops()
    call()
r0 = rate()
times, cpu = [], []
for _ in range(repeats):
    t, c = time.perf_counter(), time.process_time(); call(); times.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
r1 = rate()
if profile:
    from torch.profiler import profile as prof, ProfilerActivity
    with prof(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        call()
    print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=40,
                                                         max_shapes_column_width=70), file=sys.stderr)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
print(json.dumps({"flops": flops, "times": times, "cpu": cpu, "rates": [r0[0], r1[0]], "cpu_rates": [r0[1], r1[1]],
                  "threads": torch.get_num_threads()}))
"""

NAMES = {"node": "node attribution patching", "edge": "edge attribution patching", "second": "second order"}


def run(helper: str, batch: int, pos: int, repeats: int, all_positions: bool, profile: bool = False, threads: int = 0) -> dict:
    done = subprocess.run([sys.executable, "-c", _CODE, helper, str(batch), str(pos), str(repeats), str(int(all_positions)),
                           str(int(profile)), str(threads)], capture_output=True, text=True, check=True)
    if profile:
        print(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("--helpers", nargs="+", default=list(NAMES), choices=list(NAMES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--all-positions", action="store_true", help="second order at every position (default: [-2])")
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of one more call")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the child (default: torch's own)")
    args = ap.parse_args()
    print(f"GPT-2 small (random weights), {args.batch} x {args.pos} tokens")
    print("ratio: median wall time / (FLOPs / large-matmul rate); cpu ratio: the same in process CPU time (a shared "
          "machine's proxy, meaningful with --threads 1)")
    print(f"{'helper':<28} {'median':>8} {'times':>18} {'FLOPs':>6} {'GFLOP/s':>8} {'bound':>7} {'ratio':>6} {'cpu ratio':>9}")
    for h in args.helpers:
        r = run(h, args.batch, args.pos, args.repeats, args.all_positions, args.profile, args.threads)
        times, cpu = sorted(r["times"]), sorted(r["cpu"])
        med, best_rate = times[len(times) // 2], max(r["rates"])
        bound = r["flops"] / best_rate
        cpu_ratio = cpu[len(cpu) // 2] / (r["flops"] / max(r["cpu_rates"]))
        print(f"{NAMES[h]:<28} {med:7.2f}s {' '.join(f'{t:.2f}' for t in r['times']):>18} {r['flops'] / 1e9:5.0f}G "
              f"{best_rate / 1e9:8.0f} {bound:6.2f}s {med / bound:6.2f} {cpu_ratio:9.2f}  ({r['threads']} threads)", flush=True)


if __name__ == "__main__":
    main()
