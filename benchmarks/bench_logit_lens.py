"""Logit lens on a GPT-2-small-shaped model (random weights): rs_interp vs the TransformerLens recipe.

The recipe, ``cache.accumulated_resid(apply_ln=True)`` then ``model.unembed``, holds
(reading point, batch, pos, d_vocab) at once: 13 x 8 x 1024 x 50257 floats, about 21 GB, at batch
8 x 1024. We run it at a size that fits (1 x 1024 by default) and rs_interp.logit_lens at the full
8 x 1024, each in its own subprocess so that each peak RSS is its own, and print both side by side.

Usage: python benchmarks/bench_logit_lens.py [--batch 8] [--recipe-batch 1] [--pos 1024]
Goals (issue 4): peak extra memory under 1 GB at 8 x 1024, and no slower per token than the recipe.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time, torch
import rs_interp as ri
torch.set_grad_enabled(False)
tool, batch, pos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = ri.load_gpt2("random")
tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))
targets = ri.next_token_targets(tokens)  # -1 at the last position: skipped (NaN in ours)
def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
base = rss_now()
t = time.perf_counter()
if tool == "ours":
    lens = ri.logit_lens(model, tokens, targets=targets, top_k=5)
    check = float(lens.target_probs[-1].nanmean())
else:
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: "resid" in n or "ln_final" in n)
    resid = cache.accumulated_resid(apply_ln=True)
    logits = model.unembed(resid)
    lp = logits.log_softmax(-1)
    probs = lp.gather(-1, targets.clamp(min=0)[None, ..., None].expand(lp.shape[0], -1, -1, 1))[..., 0].exp()[..., :-1]
    top = lp.topk(5, dim=-1)
    entropy = -(lp.exp() * lp).sum(-1)
    check = float(probs[-1].mean())
elapsed = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": elapsed, "peak_extra_bytes": peak - base, "tokens": batch * pos, "check": check}))
"""


def _run(tool: str, batch: int, pos: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, tool, str(batch), str(pos)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--recipe-batch", type=int, default=1)
    ap.add_argument("--pos", type=int, default=1024)
    args = ap.parse_args()
    ours = _run("ours", args.batch, args.pos)
    recipe = _run("recipe", args.recipe_batch, args.pos)
    gb = 1024**3
    full_recipe = 13 * args.batch * args.pos * 50257 * 4
    print(f"{'tool':34s} {'batch x pos':>12s} {'seconds':>9s} {'ms/token':>9s} {'peak extra':>11s}")
    for name, r, b in (("rs_interp.logit_lens", ours, args.batch), ("TL recipe (accumulated_resid)", recipe, args.recipe_batch)):
        print(f"{name:34s} {f'{b} x {args.pos}':>12s} {r['seconds']:9.1f} {1000 * r['seconds'] / r['tokens']:9.3f} "
              f"{r['peak_extra_bytes'] / gb:9.2f} GB")
    print(f"recipe's logits alone at {args.batch} x {args.pos}: {full_recipe / gb:.1f} GB (float32)")
    speed = (recipe["seconds"] / recipe["tokens"]) / (ours["seconds"] / ours["tokens"])
    print(f"per-token speed, ours / recipe: {speed:.2f}x (goal >= 1); ours' peak extra memory "
          f"{ours['peak_extra_bytes'] / gb:.2f} GB (goal < 1 GB)")


if __name__ == "__main__":
    main()
