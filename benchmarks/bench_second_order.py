"""Second-order attribution on a GPT-2-small-shaped model (random weights), one 64-token prompt, every
source and every head: rs_interp vs a straightforward per-head loop (each destination head pushes
every upstream source through its frozen LayerNorm, W_V, its pattern, W_O and the frozen final norm).
Both run in their own subprocess (own peak RSS), side by side in one run; the numbers must agree.

Usage: python benchmarks/bench_second_order.py [--pos 64] [--batch 1]
Goal (issue 16): under 3 s for 1 x 64 on 2 cores; bounded memory.
"""

from __future__ import annotations

import argparse

from _child import run_child

_SETUP = r"""
tool, batch, pos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = ri.load_gpt2("random")
g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
targets = ri.next_token_targets(tokens)  # -1 at the last position: skipped (its parts are 0)
"""

_BODY = r"""
if tool == "ours":
    out = ri.second_order_attribution(model, tokens, targets=targets).contributions
    check = out[:-2].sum().item()  # the upstream sources (not the own-bias terms)
else:
    _, cache = model.run_with_cache(tokens)
    srcs = [cache["hook_embed"], cache["hook_pos_embed"]]
    total = 0.0
    W_U = model.W_U
    d = (W_U.T[targets.clamp(min=0)] - W_U.mean(1)) * (targets >= 0)[..., None]  # skipped: 0, as ours
    s_f = cache["ln_final.hook_scale"]
    for l in range(model.cfg.n_layers):
        blk = model.blocks[l]
        S = torch.stack(srcs)  # (src, batch, pos, d_model)
        x = (S - S.mean(-1, keepdim=True)) / cache[f"blocks.{l}.ln1.hook_scale"] * blk.ln1.w
        for h in range(model.cfg.n_heads):
            v = x @ blk.attn.W_V[h]  # (src, batch, pos, d_head)
            z = torch.einsum("bqk,sbkd->sbqd", cache[f"blocks.{l}.attn.hook_pattern"][:, h], v)
            w = z @ blk.attn.W_O[h]  # (src, batch, pos, d_model)
            f = (w - w.mean(-1, keepdim=True)) / s_f * model.ln_final.w
            total += float((f * d).sum())
        z = cache[f"blocks.{l}.attn.hook_z"]
        srcs += [z[:, :, h] @ blk.attn.W_O[h] for h in range(model.cfg.n_heads)]
        srcs += [blk.attn.b_O.expand_as(srcs[0]), cache[f"blocks.{l}.hook_mlp_out"]]
    check = total
out = {"check": check}
"""


def _run(tool: str, batch: int, pos: int) -> dict:
    return run_child(_SETUP, _BODY, tool, batch, pos)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pos", type=int, default=64)
    args = ap.parse_args()
    ours, loop = _run("ours", args.batch, args.pos), _run("loop", args.batch, args.pos)
    print(f"{'tool':<16}  {'seconds':>8}  {'peak extra':>10}  check (sum of upstream contributions)")
    for name, r in (("rs_interp", ours), ("per-head loop", loop)):
        print(f"{name:<16}  {r['seconds']:8.2f}  {r['peak_extra_bytes'] / 2**30:8.2f} GB  {r['check']:.4f}")
    print(f"{args.batch}x{args.pos}: {loop['seconds'] / ours['seconds']:.2f}x faster than the loop")


if __name__ == "__main__":
    main()
