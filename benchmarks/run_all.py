"""Every heavy helper on GPT-2 small, medium, large and xl (random weights), beside TransformerLens's
equivalent where one exists and beside this machine's own matmul rate, measured in the same run.

For each (size, helper, tool) a subprocess builds the model and times one call (its own peak RSS
above the model); rs_interp's call runs under ``torch.utils.flop_counter.FlopCounterMode`` to count
its matmul FLOPs (``torch.profiler`` with FLOPs held enough to be killed on an autograd run). The bound is those FLOPs at the matmul rate measured in this run (a float32
``(2048 x d_model) @ (d_model x 50257)``, best of three); for the logit lens one measured
``log_softmax`` pass over the same rows is added, as the lens must read every logit once.
``ratio`` = time / bound: 1.0 is the machine's limit. For the gradient helpers (node and edge
attribution patching, EAP-IG) the FLOPs are those the estimate cannot avoid, counted by running
them bare (``floor_flops``: the reference's forward to the last activation needed, a forward with
gradients and a backward to the embedding alone per step, activation gradients only, plus the
contraction with the patch directions); what the call did is shown beside as "did".

Inputs: lens and DLA on 1 x 256 tokens, second order on 1 x 64 (last position), attribution
patching on 1 x 64, the resample-ablation scan on 1 x 16 (metric at the last position).
TransformerLens's equivalents: ``all_composition_scores`` (small only: it holds every pair's SVD,
~10 GB per kind there), ``accumulated_resid`` + ``unembed`` for the lens, ``stack_head_results`` +
``logit_attrs`` for DLA, ``get_act_patch_attn_head_out_all_pos`` for the scan (small only: one
full pass per head). Path expansion is for attention-only models: it is benchmarked on the toy in
``bench_composition``'s sibling tests, not here.

Usage: python benchmarks/run_all.py [--sizes small medium large xl] [--readme]
``--readme`` rewrites the table between the bench markers of docs/project/benchmarks.md (the docs' benchmarks page).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from _child import run_child

_SETUP = r"""
from transformer_lens import patching
GRADIENT = ("node attribution patching", "edge attribution patching", "EAP-IG (5 steps)")
size, helper, tool = sys.argv[1], sys.argv[2], sys.argv[3]
model = ri.load_gpt2("random", size=size)
g = torch.Generator().manual_seed(0)
V = model.cfg.d_vocab
def toks(n):
    return torch.randint(0, V, (1, n), generator=g)
t256, t64, t16, r64, r16 = toks(256), toks(64), toks(16), toks(64), toks(16)
metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 42].mean()
def call():
    if helper == "composition":
        if tool == "ours":
            return [ri.composition_scores(model, k) for k in "kqv"]
        return [model.all_composition_scores(k) for k in "KQV"]  # TransformerLens spells the kinds in capitals
    if helper == "logit lens":
        if tool == "ours":
            return ri.logit_lens(model, t256, targets=ri.next_token_targets(t256), top_k=5)
        _, cache = model.run_with_cache(t256, names_filter=lambda n: "resid" in n or "ln_final" in n)
        lp = model.unembed(cache.accumulated_resid(apply_ln=True)).log_softmax(-1)
        return lp.topk(5, dim=-1), -(lp.exp() * lp).sum(-1)
    if helper == "DLA":
        if tool == "ours":
            return ri.direct_logit_attribution(model, t256, targets=ri.next_token_targets(t256))
        _, cache = model.run_with_cache(t256)
        heads = cache.stack_head_results(layer=-1, apply_ln=True)
        return cache.logit_attrs(heads, tokens=ri.next_token_targets(t256).clamp(min=0))  # same work: every position
    if helper == "second order":
        return ri.second_order_attribution(model, t64, targets=ri.next_token_targets(t64), positions=[-2])
    if helper == "node attribution patching":
        return ri.attribution_patching(model, t64, metric, reference=r64)
    if helper == "edge attribution patching":
        return ri.edge_attribution_patching(model, t64, metric, reference=r64)
    if helper == "EAP-IG (5 steps)":
        return ri.edge_attribution_patching(model, t64, metric, reference=r64, ig_steps=5)
    if helper == "ablation scan":
        if tool == "ours":
            return ri.head_ablation_scan(model, t16, metric, method="resample", reference=r16, positions=[-1],
                                         progress=False)
        _, cache = model.run_with_cache(r16, names_filter=lambda n: n.endswith("hook_z"))
        return patching.get_act_patch_attn_head_out_all_pos(model, t16, cache, metric)
    raise ValueError(helper)
rows = {"logit lens": 256, "DLA": 256}.get(helper, 0)

def floor_flops():
    # The matmul FLOPs a gradient helper cannot avoid (counted before the timed call, so its memory
    # is not in the peak): the reference's forward, no grad, up to the last activation it needs (no
    # unembedding); per gradient pass (m of them for EAP-IG) a forward with gradients on the tokens and
    # a backward to the embedding (activation gradients only: no weight gradient is computed); for
    # EAP-IG the run's own forward up to the last activation; plus the contraction of the gradients
    # with the patch directions (node: z_ref - z per head; edge: each head's write z W_O, then one dot
    # product per edge over (batch, pos, d_model)).
    from torch.utils.flop_counter import FlopCounterMode
    cfg = model.cfg
    L, H, B, P = cfg.n_layers, cfg.n_heads, t64.shape[0], t64.shape[1]
    last = f"blocks.{L - 1}.attn.hook_z" if helper.startswith("node") else f"blocks.{L - 1}.hook_mlp_out"
    steps = 5 if helper.startswith("EAP-IG") else 1

    def stop(t, *, hook):
        raise ri._backend.Stop

    with FlopCounterMode(display=False) as c:
        for x in [r64] + ([t64] if steps > 1 else []):
            try:
                with torch.no_grad(), model.hooks(fwd_hooks=[(last, stop)]):
                    model(x, return_type=None)
            except ri._backend.Stop:
                pass
        for _ in range(steps):
            with torch.enable_grad():
                leaf = torch.zeros((), requires_grad=True)
                with model.hooks(fwd_hooks=[("hook_embed", lambda t, *, hook: t + leaf)]):
                    value = metric(model(t64, return_type="logits"))
                torch.autograd.backward(value, inputs=[leaf])
    contraction = 2 * B * P * L * H * cfg.d_head
    if not helper.startswith("node"):
        contraction = contraction * cfg.d_model + 2 * B * P * cfg.d_model * int(ri.edge_layout(model).exists.sum())
    return c.get_total_flops() + contraction

floor = floor_flops() if helper in GRADIENT else 0
"""

_BODY = r"""
from torch.utils.flop_counter import FlopCounterMode
if tool == "ours":  # the timed call also counts its matmul FLOPs (a dispatch mode: per-op overhead only)
    with FlopCounterMode(display=False) as counter:
        call()
else:
    call()
out = {}
"""

_COUNT = r"""
elapsed = time.perf_counter() - t
out["flops"] = counter.get_total_flops() if tool == "ours" else 0
if floor:  # a gradient helper: its bound is what it cannot avoid; what it did is kept beside
    out["counted_flops"], out["flops"] = out["flops"], floor
out["softmax_seconds"] = 0.0
if helper == "logit lens" and tool == "ours":  # one pass over every logit the lens must read
    n_rows = rows * (model.cfg.n_layers + 1)
    x = torch.randn(min(n_rows, 2048), V)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter(); x.log_softmax(-1); best = min(best, time.perf_counter() - t0)
    out["softmax_seconds"] = best * n_rows / x.shape[0]
t = time.perf_counter() - elapsed
"""

SIZES = ("small", "medium", "large", "xl")
D_MODEL = {"small": 768, "medium": 1024, "large": 1280, "xl": 1600}
#: (helper, TransformerLens equivalent exists, sizes where it is run)
HELPERS = [
    ("composition", {"small"}),
    ("logit lens", set(SIZES)),
    ("DLA", set(SIZES)),
    ("second order", set()),
    ("node attribution patching", set()),
    ("edge attribution patching", set()),
    ("EAP-IG (5 steps)", set()),
    ("ablation scan", {"small"}),
]


def matmul_rate(d_model: int) -> float:
    """This machine's float32 matmul rate in FLOP/s, (2048 x d_model) @ (d_model x 50257), best of three."""
    code = (f"import time, torch\na, b = torch.randn(2048, {d_model}), torch.randn({d_model}, 50257)\n"
            "a @ b\nbest = min((lambda t: (a @ b, time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))\n"
            f"print(2 * 2048 * {d_model} * 50257 / best)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def measure(size: str, helper: str, tool: str) -> dict | None:
    """One child's numbers, or None if it failed (e.g. killed for memory): the table says so."""
    try:
        return run_child(_SETUP, _BODY + _COUNT, size, helper, tool)
    except subprocess.CalledProcessError as err:
        print(f"{size} {helper} {tool}: failed ({err.returncode})", file=sys.stderr, flush=True)
        return None


def table(results: list[dict], rates: dict[str, float]) -> str:
    lines = ["| size | helper | rs_interp | peak extra | FLOPs | bound | ratio | TransformerLens | its peak | speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ours, tl = r["ours"], r.get("tl")
        if ours is None:
            lines.append(f"| {r['size']} | {r['helper']} | failed | — | — | — | — | — | — | — |")
            continue
        bound = ours["flops"] / rates[r["size"]] + ours["softmax_seconds"]
        did = f" (did {ours['counted_flops'] / 1e9:.0f} G)" if "counted_flops" in ours else ""
        tl_cols = (f"{tl['seconds']:.2f} s | {tl['peak_extra_bytes'] / 2**30:.2f} GB | {tl['seconds'] / ours['seconds']:.1f}x"
                   if tl else "failed | — | —" if "tl" in r else "— | — | —")
        lines.append(f"| {r['size']} | {r['helper']} | {ours['seconds']:.2f} s | {ours['peak_extra_bytes'] / 2**30:.2f} GB | "
                     f"{ours['flops'] / 1e9:.0f} G{did} | {bound:.2f} s | {ours['seconds'] / bound:.2f} | {tl_cols} |")
    rate_line = ", ".join(f"{s} {rates[s] / 1e9:.0f}" for s in rates)
    return "\n".join(lines) + f"\n\nMatmul rate measured in the same run (GFLOP/s, float32, by d_model): {rate_line}.\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    ap.add_argument("--helpers", nargs="+", default=[h for h, _ in HELPERS])
    ap.add_argument("--readme", action="store_true", help="rewrite the table in docs/project/benchmarks.md")
    args = ap.parse_args()
    rates: dict[str, float] = {}
    results = []
    for size in args.sizes:
        rates[size] = matmul_rate(D_MODEL[size])  # just before the size's helpers, on the same machine state
        for helper, tl_sizes in HELPERS:
            if helper not in args.helpers:
                continue
            t = time.perf_counter()
            row = {"size": size, "helper": helper, "ours": measure(size, helper, "ours")}
            if size in tl_sizes:
                row["tl"] = measure(size, helper, "transformer_lens")
            results.append(row)
            took = f"{row['ours']['seconds']:.2f} s" if row["ours"] else "failed"
            print(f"[{time.perf_counter() - t:6.0f} s] {size} {helper}: {took}", file=sys.stderr, flush=True)
        if args.readme:  # after every size, so a long run keeps what it measured
            _write_readme(table(results, rates))
    print(table(results, rates))


def _write_readme(text: str) -> None:
    readme = Path(__file__).resolve().parent.parent / "docs" / "project" / "benchmarks.md"
    body = readme.read_text()
    if "<!-- bench:start -->" not in body:
        raise SystemExit(f"{readme} has no <!-- bench:start --> ... <!-- bench:end --> markers")
    readme.write_text(re.sub(r"(<!-- bench:start -->\n).*?(<!-- bench:end -->)", lambda m: m.group(1) + text + m.group(2), body, flags=re.S))


if __name__ == "__main__":
    main()
