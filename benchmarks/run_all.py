"""Every heavy helper on GPT-2 small, medium, large and xl (random weights), beside TransformerLens's
equivalent where one exists and beside this machine's own matmul rate, measured in the same run.

For each (size, helper, tool) a subprocess builds the model, makes one untimed call (a warm-up; for
rs_interp's side it runs under ``torch.utils.flop_counter.FlopCounterMode`` to count its matmul FLOPs,
whose per-op dispatch stays out of the timed call), then times one call (its own peak RSS above the
model). The **bound** is those FLOPs at the matmul rate this machine reaches *at the call's
own shapes*, measured in the same run (:func:`shape_rate`: the model's per-layer products and the
unembedding over the call's token rows, forward and transposed, in the model's FLOP mix); a 64-row
product runs at about a third of the large-matmul rate, and no helper multiplies the model's matrices
faster than the machine does at those shapes. Composition reads the weights alone: its bound uses
the large-matmul rate (a float32 ``(2048 x d_model) @ (d_model x 50257)``, best of three), which the
table also shows every ratio against. For the logit lens one measured ``log_softmax`` pass over the
same rows is added, as the lens must read every logit once. ``ratio`` = time / bound: 1.0 is the
machine's limit. For the gradient helpers (node and edge attribution patching, EAP-IG) the FLOPs are
those the estimate cannot avoid, counted by running them bare (``floor_flops``: the reference's
forward to the last activation needed, a forward with gradients and a backward to the embedding
alone per step, activation gradients only, plus the contraction with the patch directions); that
bare run is their warm-up.

Every row with a TransformerLens column also shows the **max abs difference** of the two sides'
numbers (each child saves them in one layout; the parent compares where ours defines a value): the
baselines compute what rs_interp computes. Composition: ours with ``full_circuit=True``, TransformerLens's
definition, vs ``all_composition_scores``; the lens: the target's probability at every reading point;
DLA: every head's share of the target's centred logit (the unembedding is centred in the set-up, as
TransformerLens's processing leaves pretrained weights, so ``logit_attrs`` reads the same quantity; it
applies the final LayerNorm scale itself, so the head stack goes in unscaled); the scan: the metric
with each head patched.

Inputs: lens and DLA on 1 x 256 tokens, second order on 1 x 64 (last position), attribution
patching on 1 x 64, the resample-ablation scan on 1 x 16 (metric at the last position); the circuit
helpers on 1 x 64: exact path patching of one source head (the middle layer's head 1) into every later
head's query, the faithfulness curve at MIB's ten circuit sizes (ranked by edge attribution patching,
untimed). Their bound is their own counted FLOPs, as for the forward helpers.
TransformerLens's equivalents: ``all_composition_scores`` (small only: it holds every pair's SVD,
~10 GB per kind there), ``accumulated_resid`` + ``unembed`` for the lens, ``stack_head_results`` +
``logit_attrs`` for DLA, ``get_act_patch_attn_head_out_all_pos`` for the scan (small only: one
full pass per head). Its ``tools.analysis`` (4.3: attribution patching, faithfulness, direct path
patching, ``logit_lens``, ``direct_logit_attribution``) is compared in ``bench_tl_tools.py``. Path
expansion is for attention-only models: it is benchmarked on the toy in ``bench_composition``'s
sibling tests, not here.

Usage: python benchmarks/run_all.py [--sizes small medium large xl] [--helpers ...] [--skip SIZE:HELPER ...] [--readme]
``--readme`` rewrites the table between the bench markers of docs/project/benchmarks.md (the docs' benchmarks page).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _child import run_child

_SETUP = r"""
import re
from transformer_lens import patching
GRADIENT = ("node attribution patching", "edge attribution patching", "EAP-IG (5 steps)")
size, helper, tool, result_path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
model = ri.load_gpt2("random", size=size)
# The unembedding centred, as TransformerLens's processing leaves pretrained weights: DLA's baseline
# (logit_attrs) then reads the same centred logit as ours
ri._backend.set_unembedding(model, model.W_U - model.W_U.mean(-1, keepdim=True))
g = torch.Generator().manual_seed(0)
V = model.cfg.d_vocab
def toks(n):
    return torch.randint(0, V, (1, n), generator=g)
t256, t64, t16, r64, r16 = toks(256), toks(64), toks(16), toks(64), toks(16)
metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 42].mean()
def call():
    if helper == "composition":
        if tool == "ours":  # the full circuit: TransformerLens's definition, so both compute the same scores
            return [ri.composition_scores(model, k, full_circuit=True) for k in "kqv"]
        return [model.all_composition_scores(k) for k in "KQV"]  # TransformerLens spells the kinds in capitals
    if helper == "logit lens":
        if tool == "ours":
            return ri.logit_lens(model, t256, targets=ri.next_token_targets(t256), k=5)
        _, cache = model.run_with_cache(t256, names_filter=lambda n: "resid" in n or "ln_final" in n)
        lp = model.unembed(cache.accumulated_resid(apply_ln=True)).log_softmax(-1)
        targets = ri.next_token_targets(t256).clamp(min=0)  # the same work as ours: top 5, entropy, target's probability
        return lp.topk(5, dim=-1), -(lp.exp() * lp).sum(-1), lp.gather(-1, targets[None, ..., None].expand(lp.shape[0], -1, -1, 1))[..., 0].exp()
    if helper == "DLA":
        if tool == "ours":
            return ri.direct_logit_attribution(model, t256, targets=ri.next_token_targets(t256))
        _, cache = model.run_with_cache(t256)
        # logit_attrs applies the final LayerNorm (the cached scale) itself: the stack goes in unscaled
        heads = cache.stack_head_results(layer=-1, apply_ln=False)
        return cache.logit_attrs(heads, tokens=ri.next_token_targets(t256).clamp(min=0))  # same work: every position
    if helper == "second order":
        return ri.second_order_attribution(model, t64, targets=ri.next_token_targets(t64), positions=[-2])
    if helper == "node attribution patching":
        return ri.attribution_patching(model, t64, metric, reference=r64)
    if helper == "edge attribution patching":
        return ri.edge_attribution_patching(model, t64, metric, reference=r64)
    if helper == "EAP-IG (5 steps)":
        return ri.edge_attribution_patching(model, t64, metric, reference=r64, ig_steps=5)
    if helper == "path patching":  # exact, one source head (the middle layer's head 1) into every later query
        return ri.path_patching(model, t64, metric, reference=r64, edges=direct_edges)
    if helper == "faithfulness curve":  # MIB's ten circuit sizes, the circuits ranked by edge AP (untimed)
        return ri.faithfulness_curve(model, t64, metric, ranking, reference=r64)
    if helper == "ablation scan":
        if tool == "ours":
            return ri.head_ablation_scan(model, t16, metric, ablation="resample", reference=r16, positions=[-1],
                                         progress=False)
        _, cache = model.run_with_cache(r16, names_filter=lambda n: n.endswith("hook_z"))
        return patching.get_act_patch_attn_head_out_all_pos(model, t16, cache, metric)
    raise ValueError(helper)
rows = {"logit lens": 256, "DLA": 256}.get(helper, 0)
L, H = model.cfg.n_layers, model.cfg.n_heads
direct_edges = [(f"L{L // 2}H1", f"L{l}H{h}.q") for l in range(L // 2 + 1, L) for h in range(H)]
ranking = ri.edge_attribution_patching(model, t64, metric, reference=r64) if helper == "faithfulness curve" else None

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

# Before the clock starts, one untimed call of each side (a warm-up: first-call costs are not the
# helper's): ours counts its matmul FLOPs there, under FlopCounterMode, whose per-op dispatch would
# slow the timed call (the gradient helpers: their floor, counted bare, is that call).
floor, counted = 0, 0
if helper in GRADIENT:
    floor = floor_flops()
elif tool == "ours":
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        call()
    counted = counter.get_total_flops()
else:
    call()
"""

_BODY = r"""
res = call()
out = {}
"""

_COUNT = r"""
elapsed = time.perf_counter() - t
out["flops"] = floor or counted  # a gradient helper's bound: the FLOPs it cannot avoid
out["softmax_seconds"] = 0.0
if helper == "logit lens" and tool == "ours":  # one pass over every logit the lens must read
    n_rows = rows * (model.cfg.n_layers + 1)
    x = torch.randn(min(n_rows, 2048), V)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter(); x.log_softmax(-1); best = min(best, time.perf_counter() - t0)
    out["softmax_seconds"] = best * n_rows / x.shape[0]
# Each side's numbers in one layout (float64), saved for the parent to compare: the baselines must
# compute what rs_interp computes, so every row with a TransformerLens column shows the max abs difference.
values = None
if helper == "composition":  # (kind, layer, head, layer, head); ours NaN where no composition
    values = torch.stack([(r.scores if tool == "ours" else r).double() for r in res])
elif helper == "logit lens":  # the target's probability at every (reading point, batch, pos)
    if tool == "ours":
        values = res.target_probs.double()
    else:
        values = res[2].double()
        values[:, ri.next_token_targets(t256) < 0] = float("nan")
elif helper == "DLA":  # every head's share, (layer * head, batch, pos)
    if tool == "ours":
        heads = [i for i, lab in enumerate(res.labels) if re.fullmatch(r"L\d+H\d+", lab)]
        values = res.contributions[heads].double()
    else:
        values = res.double()
    values[:, ri.next_token_targets(t256) < 0] = float("nan")
elif helper == "ablation scan":  # the metric with each head patched from the reference, (layer, head)
    values = (res.ablated if tool == "ours" else res).double()
if values is not None:
    torch.save(values, result_path)
t = time.perf_counter() - elapsed
"""

SIZES = ("small", "medium", "large", "xl")
D_MODEL = {"small": 768, "medium": 1024, "large": 1280, "xl": 1600}
N_LAYERS = {"small": 12, "medium": 24, "large": 36, "xl": 48}
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
    ("path patching", set()),
    ("faithfulness curve", set()),
]


def matmul_rate(d_model: int) -> float:
    """This machine's float32 matmul rate in FLOP/s, (2048 x d_model) @ (d_model x 50257), best of three."""
    code = (f"import time, torch\na, b = torch.randn(2048, {d_model}), torch.randn({d_model}, 50257)\n"
            "a @ b\nbest = min((lambda t: (a @ b, time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))\n"
            f"print(2 * 2048 * {d_model} * 50257 / best)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


#: Token rows per helper (batch x pos of its inputs); composition reads the weights alone.
ROWS = {"logit lens": 256, "DLA": 256, "second order": 64, "node attribution patching": 64,
        "edge attribution patching": 64, "EAP-IG (5 steps)": 64, "ablation scan": 16, "path patching": 64,
        "faithfulness curve": 64}


def shape_rate(size: str, rows: int) -> float:
    """This machine's float32 matmul rate in FLOP/s at the shapes a pass over ``rows`` tokens of GPT-2
    ``size`` multiplies: per layer q, k, v, the output projection and the MLP's two matmuls, the
    unembedding once, each forward and as its backward's input gradient (the transposed product), in
    the model's mix of FLOPs (``n_layers`` layers per unembedding); best of three.

    A few-row matmul runs far below the large-matmul rate (64 rows: about a third), and no helper
    can multiply the model's matrices faster than that: this is the rate a pass's bound uses."""
    code = f"""
import time, torch
d, L, V, rows = {D_MODEL[size]}, {N_LAYERS[size]}, 50257, {rows}
layer = [(d, d)] * 4 + [(d, 4 * d), (4 * d, d)]  # W_Q, W_K, W_V, W_O, W_in, W_out
def shapes(pairs):  # each (in, out) forward, then its backward's input gradient (rows x out) @ (out x in)
    return [(torch.randn(rows, i), torch.randn(i, o)) for i, o in pairs] + [(torch.randn(rows, o), torch.randn(o, i)) for i, o in pairs]
def best(mats):
    for a, b in mats:
        a @ b
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for a, b in mats:
            a @ b
        times.append(time.perf_counter() - t)
    return min(times), sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in mats)
(t_layer, f_layer), (t_unembed, f_unembed) = best(shapes(layer)), best(shapes([(d, V)]))
print((L * f_layer + f_unembed) / (L * t_layer + t_unembed))
"""
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def measure(size: str, helper: str, tool: str, result: Path) -> dict | None:
    """One child's numbers, or None if it failed (e.g. killed for memory): the table says so. The
    child saves its numbers (one layout for both sides) to ``result`` where a baseline exists."""
    try:
        return run_child(_SETUP, _BODY + _COUNT, size, helper, tool, result)
    except subprocess.CalledProcessError as err:
        print(f"{size} {helper} {tool}: failed ({err.returncode}):\n{err.stderr[-1500:]}", file=sys.stderr, flush=True)
        return None


def max_abs_diff(ours: Path, theirs: Path) -> float:
    """The largest |ours - theirs| over the entries ours defines (NaN: no such entry, e.g. a pair of
    heads that cannot compose or a position without a target); inf if the other side lacks one."""
    import torch

    a, b = torch.load(ours), torch.load(theirs)
    if a.shape != b.shape:
        raise AssertionError(f"the two sides' numbers differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    ok = ~a.isnan()
    return float((a[ok] - b[ok]).abs().max())


def table(results: list[dict], rates: dict[str, float]) -> str:
    # TransformerLens's columns beside ours (what a TransformerLens user compares), then the bound's
    lines = ["| size | helper | rs_interp | TransformerLens | speed-up | max abs diff | peak extra | TL's peak "
             "| FLOPs | bound | ratio | ratio, large-matmul rate |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ours, tl = r["ours"], r.get("tl")
        if ours is None:
            lines.append(f"| {r['size']} | {r['helper']} | failed |" + " — |" * 9)
            continue
        # the bound: the FLOPs at the rate of the call's own shapes (composition: the large-matmul rate)
        bound = ours["flops"] / r["rate"] + ours["softmax_seconds"]
        big = ours["flops"] / rates[r["size"]] + ours["softmax_seconds"]
        if tl:
            tl_time, speed, diff, tl_peak = (f"{tl['seconds']:.2f} s", f"{tl['seconds'] / ours['seconds']:.1f}x", f"{r['diff']:.1e}",
                                             f"{tl['peak_extra_bytes'] / 2**30:.2f} GB")
        else:
            tl_time, speed, diff, tl_peak = ("failed" if "tl" in r else "—"), "—", "—", "—"
        lines.append(f"| {r['size']} | {r['helper']} | {ours['seconds']:.2f} s | {tl_time} | {speed} | {diff} | "
                     f"{ours['peak_extra_bytes'] / 2**30:.2f} GB | {tl_peak} | {ours['flops'] / 1e9:.0f} G | {bound:.2f} s | "
                     f"{ours['seconds'] / bound:.2f} | {ours['seconds'] / big:.2f} |")
    rate_line = ", ".join(f"{s} {rates[s] / 1e9:.0f}" for s in rates)
    shape_line = "; ".join(f"{s}: " + ", ".join(f"{n} rows {v / 1e9:.0f}" for n, v in sorted(by_rows.items()))
                           for s, by_rows in _shape_rates(results).items())
    return ("\n".join(lines) + f"\n\nMatmul rates measured in the same run (GFLOP/s, float32): large matmuls "
            f"(2048 x d_model x 50257) {rate_line}; at the calls' shapes (per size, by token rows) {shape_line}.\n")


def _shape_rates(results: list[dict]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in results:
        if r["helper"] in ROWS:
            out.setdefault(r["size"], {})[ROWS[r["helper"]]] = r["rate"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    ap.add_argument("--helpers", nargs="+", default=[h for h, _ in HELPERS])
    ap.add_argument("--skip", nargs="+", default=[], metavar="SIZE:HELPER",
                    help='leave one size\'s helper out, e.g. --skip "xl:ablation scan"')
    ap.add_argument("--readme", action="store_true", help="rewrite the table in docs/project/benchmarks.md")
    args = ap.parse_args()
    rates: dict[str, float] = {}
    results = []
    for size in args.sizes:
        rates[size] = matmul_rate(D_MODEL[size])  # just before the size's helpers, on the same machine state
        by_rows = {n: shape_rate(size, n) for n in sorted(set(ROWS.values()))}
        for helper, tl_sizes in HELPERS:
            if helper not in args.helpers or f"{size}:{helper}" in args.skip:
                continue
            t = time.perf_counter()
            with tempfile.TemporaryDirectory() as d:
                row = {"size": size, "helper": helper, "ours": measure(size, helper, "ours", Path(d) / "ours.pt"),
                       "rate": by_rows[ROWS[helper]] if helper in ROWS else rates[size]}
                if size in tl_sizes:
                    row["tl"] = measure(size, helper, "transformer_lens", Path(d) / "tl.pt")
                    if row["ours"] and row["tl"]:
                        row["diff"] = max_abs_diff(Path(d) / "ours.pt", Path(d) / "tl.pt")
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
