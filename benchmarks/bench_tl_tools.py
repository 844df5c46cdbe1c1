"""rs_interp beside TransformerLens's own analysis tools (``transformer_lens.tools.analysis``), on
GPT-2 small with random weights. The patching rows read 16 clean/corrupt pairs of 8 tokens and a
per-example logit difference at the last position averaged over the batch; the logit lens and DLA
rows read 16 sequences of 64 tokens (``--lens-pos``: at 8 tokens the unembedding of a handful of
rows and the fixed costs would be all that is timed; 16 x 64 is also the largest input the 3.x
recipe holds at once, 13 x 1024 x 50257 floats a copy) with next-token targets
(``ri.next_token_targets``: the last position has none and is left out of the comparison). Each
(row, tool) runs in its own subprocess (its own peak RSS above the loaded model, its high-water mark
reset after loading); the numbers each side returns are compared here, conventions mapped
(patching: TransformerLens denoising, per position, averaged over pairs; rs_interp: run = corrupt,
reference = clean, summed over positions and over the batch of the mean metric).

Each child times **the first call** on the model it loaded (rs_interp's measures the model's certificate in
it, as a notebook user's first call does; TransformerLens's pays its own first-call costs) and then the same
call again, **warm** (the certificate cached): both are printed, with the speed-up of each.

Rows:

- node attribution patching: ``ri.attribution_patching`` vs ``attribution_patch`` (node), on
  ``ri.load_gpt2("random")``; compared per head and position (TransformerLens also scores the embed
  and MLP writes; the head scores are ours' whole output);
- edge attribution patching: ``ri.edge_attribution_patching`` vs ``attribution_patch`` (edge), every
  edge summed over positions;
- direct path patching from one source head into every later head's q (``--source``, ``--component``):
  ``ri.path_patching`` on those edges vs ``get_act_patch_direct_path`` (its two ``run_with_cache``
  calls timed with it), its patched metric minus the corrupt one;
- faithfulness of one pair's circuit (the top ``--edges`` edges of our edge estimate on that pair):
  ``ri.evaluate_circuit`` (and the clean and corrupt metrics) vs ``faithfulness`` (which also
  re-runs the circuit once per edge class it holds), the recovered fraction and the circuit's metric;
- logit lens, on ``ri.load_gpt2("random")``: ``ri.logit_lens(model, tokens, targets=..., k=5)``
  (top 5, entropy, the target's probability) vs 4.3's ``logit_lens(model, tokens, positions=None,
  targets=..., return_type="log_probs")``, which takes one selector per call (targets, ``top_k`` or
  ``vocab``): timed with the targets (their log-probability, the entropy, the target's rank), not the
  top 5, a lower bound on its time for our readings. 3.x has no such tool: its baseline is the recipe
  ``run_with_cache`` (residual hooks), ``accumulated_resid(apply_ln=True)`` (each point normalised
  with its own recomputed scale), ``unembed``, ``log_softmax``, then the same top 5, entropy and
  target. Compared: the target's probability at every (reading point, batch, pos) with a target; the
  reading points are matched by the tensor read (TransformerLens's ``k_pre`` is block k's input, our
  ``L{k-1}``; ``0_pre`` our ``embed``; ``final_post`` our last ``L``), the same set checked here;
- direct logit attribution, on ``ri.load_gpt2("random")``: ``ri.direct_logit_attribution(model,
  tokens, targets=...)`` vs 4.3's ``direct_logit_attribution(model, tokens, answer_tokens=...,
  unit="head", pos=None)`` (compatibility mode and a folded final norm, which ``ri.load_gpt2``
  gives), under 3.x ``cache.stack_head_results(apply_ln=False)`` then ``cache.logit_attrs`` (which
  applies the final LayerNorm's cached scale itself). Both freeze the final norm's scale. Ours splits
  the target's centred logit (logit[target] minus the mean logit), TransformerLens logit[target]:
  per head they differ by the head's write read along ``W_U.mean(-1)``, which is not 0 here
  (``ri.load_gpt2("random")`` has no TransformerLens processing), so the DLA child centres ``W_U``
  over the vocabulary before either side runs, what ``center_unembed`` does to every checkpoint
  TransformerLens loads; with ``b_U`` = 0 the two metrics are then one number. Compared per (layer,
  head, batch, pos) with a target (TransformerLens's remainder and our embedding, bias and MLP terms
  are left out);
- K, Q and V composition of every head pair, on ``ri.load_gpt2("random")``: ``ri.composition_scores(model, k,
  full_circuit=True)`` (TransformerLens's definition) for k in q, k, v vs ``model.all_composition_scores``
  for each kind, compared where the source head's layer is earlier (TransformerLens fills the rest too).

TransformerLens 4.3 refuses edges, faithfulness and direct path patching on the native bridge that
``ri.load_gpt2("random")`` builds (``NativeAttention`` has no per-head result or split q/k/v inputs:
NotImplementedError, checked in the node row's child and printed under the table); those rows run,
for both sides, on a bridge over Hugging Face GPT-2 small attention with random weights (``hf``:
a ``GPT2LMHeadModel(GPT2Config())`` seeded 0, saved to a temporary directory and loaded unfolded
with ``ri.load_gpt2(path, fold_ln=False)``; 3.x loads the same checkpoint as a HookedTransformer).
TransformerLens 3.9 has node attribution and direct path patching only, and its direct path patching
is a frozen-LayerNorm-scale linearisation, not the exact patch (``tests/integration/test_tl_tools.py``): its
difference column is that approximation's error.

Model column: ``random`` is ``ri.load_gpt2("random")``, ``hf`` the Hugging Face checkpoint. TransformerLens
scores each pair in passes of its own, so its time hardly depends on ``--pos``; 8 tokens keep the
patching rows to about 6 minutes under 4.x and 3 under 3.x on 2 cores (16 and 5 when other work
shares them: the header prints the load average); the lens and DLA rows add their own runs (not yet timed on a quiet machine).

Usage: python benchmarks/bench_tl_tools.py [--batch 16] [--pos 8] [--lens-pos 64] [--source 9.1] [--component q]
    [--edges 300] [--rows node edge direct faithfulness lens dla composition]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _child import EPILOGUE, PRELUDE, START

_SETUP = r"""
import re
from transformer_lens.tools.analysis import attribution_patching as tl
from rs_interp import _backend
TL4 = _backend.TL_MAJOR >= 4
row, side, batch, pos, hf_path, result = sys.argv[1:7]
batch, pos = int(batch), int(sys.argv[10]) if row in ("lens", "dla") else int(pos)
src_l, src_h = (int(v) for v in sys.argv[7].split("."))
component, n_keep = sys.argv[8], int(sys.argv[9])
warnings.filterwarnings("ignore")
for name in ("attribution_patching", "edge_attribution_patching", "path_patching", "logit_lens",
             "direct_logit_attribution", "composition_scores", "evaluate_circuit"):
    getattr(ri, name)  # imported before the timing, as TransformerLens's tools are above
native = row in ("node", "lens", "dla", "composition")
model = ri.load_gpt2("random", size="small") if native else ri.load_gpt2(hf_path, fold_ln=False)
L, H = model.cfg.n_layers, model.cfg.n_heads
g = torch.Generator().manual_seed(0)
clean = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
corrupt = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
targets = ri.next_token_targets(clean)  # lens and DLA: -1 at the last position (ours skips it)
if row == "dla":
    # ri.load_gpt2("random") has none of TransformerLens's weight processing, so its W_U is not
    # centred over the vocabulary; centred as center_unembed centres every checkpoint TransformerLens
    # loads, our metric (logit[target] minus the mean logit) and TransformerLens's (logit[target])
    # are one number (b_U is 0). Both sides run on the centred model.
    print(json.dumps({"W_U": [float(model.W_U.mean(-1).abs().max()), float(model.W_U.abs().mean()),
                              float(model.b_U.abs().max())]}))
    ri._backend.set_unembedding(model, model.W_U.detach() - model.W_U.detach().mean(-1, keepdim=True))  # W_U is a view on 4.x
metric = lambda logits: (logits[:, -1, 42] - logits[:, -1, 43]).mean()  # per pair; the batch mean
layout = ri.edge_layout(model)
if row == "faithfulness":  # one pair; the circuit: our edge estimate's top edges on it (untimed, both sides)
    clean, corrupt = clean[:1], corrupt[:1]
    circuit = sorted(ri.top_edges(ri.edge_attribution_patching(model, corrupt, metric, reference=clean), n_keep))
    model.__dict__.pop("_rs_interp_certificate", None)  # the timed first call measures it, as a user's does
dests = [(l, h) for l in range(src_l + 1, L) for h in range(H)]
direct_edges = [(f"L{src_l}H{src_h}", f"L{l}H{h}.{component}") for l, h in dests]
try:  # the peak from here on: loading (a checkpoint's copies) must not count (resets ru_maxrss too)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass

def node(label, p, reader):
    if label == "embed":
        return tl.Node("embed", p)
    if label == "logits":
        return tl.Node("logits", p, layer=L - 1)
    if label.startswith("MLP"):
        return tl.Node("mlp_in" if reader else "mlp_out", p, layer=int(label[3:]))
    head, _, x = label.partition(".")
    l, h = (int(v) for v in head[1:].split("H"))
    return tl.Node(f"{x}_input" if x else "attn_head_out", p, layer=l, head=h)

def logit_lens_recipe(tokens, targets):  # 3.x's logit lens: the cache, accumulated_resid, unembed
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_resid_pre", "hook_resid_post")))
    stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    del cache
    lp = model.unembed(stack).log_softmax(-1)
    del stack
    top, entropy = lp.topk(5, dim=-1), -(lp.exp() * lp).sum(-1)  # the same readings as ours
    return lp.gather(-1, targets[None, ..., None].expand(lp.shape[0], -1, -1, 1))[..., 0], labels

def direct_path_tool():
    if TL4:
        from transformer_lens.patching import get_act_patch_direct_path
    else:
        from transformer_lens.tools.analysis import get_act_patch_direct_path
    return get_act_patch_direct_path
"""

_BODY = r"""
def call():
    if side == "ours":
        if row == "node":
            return ri.attribution_patching(model, corrupt, metric, reference=clean)
        if row == "edge":
            return ri.edge_attribution_patching(model, corrupt, metric, reference=clean)
        if row == "direct":
            return ri.path_patching(model, corrupt, metric, reference=clean, edges=direct_edges)
        if row == "lens":
            return ri.logit_lens(model, clean, targets=targets, k=5)
        if row == "dla":
            return ri.direct_logit_attribution(model, clean, targets=targets)
        if row == "composition":  # the full circuit: TransformerLens's definition, the same numbers
            return [ri.composition_scores(model, k, full_circuit=True).scores for k in "kqv"]
        kept = ri.evaluate_circuit(model, clean, metric, circuit, reference=corrupt)
        return kept, float(metric(model(clean))), float(metric(model(corrupt)))
    if row == "node":
        with torch.enable_grad():
            return tl.attribution_patch(model, clean, corrupt, metric)
    if row == "edge":
        with torch.enable_grad():
            return tl.attribution_patch(model, clean, corrupt, metric, tl.EdgeAttributionConfig(granularity="edge"))
    if row == "direct":
        _, cc = model.run_with_cache(clean)
        _, kc = model.run_with_cache(corrupt)
        return direct_path_tool()(model, corrupt, cc, kc, metric, src_l, src_h, component, verbose=False)
    if row == "lens":
        if TL4:  # one selector per call: the target's log-probability (with entropy and rank), no top 5
            from transformer_lens.tools.analysis import logit_lens
            res = logit_lens(model, clean, positions=None, targets=targets.clamp(min=0), return_type="log_probs")
            return res.values[..., 0], res.labels
        return logit_lens_recipe(clean, targets.clamp(min=0))
    if row == "dla":
        if TL4:
            from transformer_lens.tools.analysis import direct_logit_attribution
            res = direct_logit_attribution(model, clean, answer_tokens=targets.clamp(min=0), unit="head", pos=None)
            return res.attribution, res.labels
        _, cache = model.run_with_cache(clean)
        # logit_attrs applies the final LayerNorm (the cached scale) itself: the stack goes in unscaled
        heads, labels = cache.stack_head_results(layer=-1, apply_ln=False, return_labels=True)
        return cache.logit_attrs(heads, tokens=targets.clamp(min=0)), labels
    if row == "composition":  # one kind at a time (TransformerLens holds every pair's factors: ~8 GB a kind here)
        return [model.all_composition_scores(k) for k in "KQV"]
    return tl.faithfulness(model, clean, corrupt, metric,
                           [(node(s, p, False), node(r, p, True)) for s, r in circuit for p in range(pos)])

first = time.perf_counter()
res = call()  # the first call on this model (ours: the certificate measured in it, as a notebook user sees)
first = time.perf_counter() - first
warm = time.perf_counter()
res = call()  # the same call again (ours: the certificate cached)
out = {"first": first, "warm": time.perf_counter() - warm}
"""

#: After the timing (EPILOGUE has printed it): each side's numbers in one layout, saved for the parent.
_POST = r"""
if row == "node":
    if side == "ours":
        values = res.effect_per_position.double()  # (layer, head, pos)
    else:
        values = torch.full((L, H, pos), float("nan"), dtype=torch.float64)
        for n, v in res.node_scores.items():
            if n.kind == "attn_head_out":
                values[n.layer, n.head, n.position] = v
        if TL4:  # what 4.3 refuses on this native bridge
            refused = {}
            _, cc = model.run_with_cache(clean[:1])
            one = clean[:1], corrupt[:1]
            for name, fn in [("edge attribution_patch", lambda: tl.attribution_patch(model, *one, metric, tl.EdgeAttributionConfig(granularity="edge"))),
                             ("faithfulness", lambda: tl.faithfulness(model, *one, metric, [])),
                             ("get_act_patch_direct_path", lambda: direct_path_tool()(model, one[1], cc, cc, metric, 0, 0, "q", verbose=False))]:
                try:
                    with torch.enable_grad():
                        fn()
                    refused[name] = "accepted"
                except Exception as err:
                    refused[name] = f"{type(err).__name__}: {str(err).split('.')[0]}"
            print(json.dumps({"refused": refused}))
elif row == "edge":
    if side == "ours":
        values = res.effect.double()  # (sender, receiver), NaN where no edge
    else:
        col = {r: j for j, r in enumerate(layout.receivers)}
        row_of = {s: i for i, s in enumerate(layout.senders)}
        label = lambda n: ("embed" if n.kind == "embed" else "logits" if n.kind == "logits" else f"MLP{n.layer}"
                           if n.kind in ("mlp_in", "mlp_out") else f"L{n.layer}H{n.head}" + ("" if n.kind == "attn_head_out" else "." + n.kind[0]))
        values = torch.full(tuple(layout.exists.shape), float("nan"), dtype=torch.float64)
        for (w, r), v in res.edge_scores.items():
            i, j = row_of[label(w)], col[label(r)]
            values[i, j] = v if values[i, j].isnan() else values[i, j] + v
        print(json.dumps({"edge entries": len(res.edge_scores), "edges x positions": layout.n_edges * pos}))
elif row == "lens":  # the target's probability, (reading point, batch, pos), NaN where there is no target
    values, labels = (res.target_probs, res.labels) if side == "ours" else (res[0].exp(), res[1])
    values = values.double().clone()
    values[:, targets < 0] = float("nan")
    print(json.dumps({f"lens labels {side}": list(labels)}))
elif row == "dla":  # every head's part, (layer * head, batch, pos), NaN where there is no target
    values, labels = (res.contributions, res.labels) if side == "ours" else res
    heads = [i for i, lab in enumerate(labels) if re.fullmatch(r"L\d+H\d+", lab)]
    values = values[heads].double().clone()
    values[:, targets < 0] = float("nan")
    print(json.dumps({f"dla heads {side}": [labels[i] for i in heads]}))
elif row == "composition":  # (kind, src layer, src head, dst layer, dst head), NaN where the source is not earlier
    values = torch.stack([r.double() for r in res])
    later = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]
    values[:, ~later.expand(L, H, L, H)] = float("nan")
elif row == "direct":
    if side == "ours":
        values = torch.tensor([res.edge(*e) for e in direct_edges], dtype=torch.float64)
    else:
        with torch.no_grad():
            m_corrupt = float(metric(model(corrupt)))
        values = torch.tensor([float(res[l, h]) - m_corrupt for l, h in dests], dtype=torch.float64)
else:  # the recovered fraction and the circuit's metric
    if side == "ours":
        kept, m_clean, m_corrupt = res
        recovered = (kept - m_corrupt) / (m_clean - m_corrupt)
    else:
        recovered, m_clean, m_corrupt = res.recovered, res.full_metric, res.corrupt_metric
        kept = m_corrupt + recovered * (m_clean - m_corrupt)
    values = torch.tensor([recovered, kept], dtype=torch.float64)
    print(json.dumps({f"faithfulness {side}": [recovered, m_clean, m_corrupt]}))
torch.save(values, result)
"""

ROWS = {
    "node": "node attribution patching",
    "edge": "edge attribution patching",
    "direct": "direct path patching, one source",
    "faithfulness": "faithfulness, one pair",
    "lens": "logit lens, target probabilities",
    "dla": "direct logit attribution, per head",
    "composition": "K, Q and V composition, all pairs",
}
#: What TransformerLens 3.9 lacks, per row.
MISSING_3 = {"edge": "TransformerLens 3.9: attribution_patch has no edge granularity",
             "faithfulness": "TransformerLens 3.9: tools.analysis has no faithfulness"}


def run(row: str, side: str, args, hf_path: str, result: Path) -> dict:
    """One child: PRELUDE + setup, the timed body, EPILOGUE (time and peak), then _POST (saves the numbers)."""
    code = PRELUDE + _SETUP + START + _BODY + EPILOGUE + _POST
    argv = [row, side, args.batch, args.pos, hf_path, result, args.source, args.component, args.edges, args.lens_pos]
    done = subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{row} {side} failed:\n{done.stderr[-3000:]}")
    out: dict = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            out.update(json.loads(line))
    return out


def check_labels(notes: dict) -> None:
    """Raise unless the lens rows read the same points and the DLA rows split into the same heads."""
    if "lens labels ours" in notes:
        n = sum(lab.startswith("L") for lab in notes["lens labels ours"])
        mapped = ["embed" if lab == "0_pre" else f"L{n - 1}" if lab == "final_post" else f"L{int(lab[:-4]) - 1}"
                  for lab in notes["lens labels tl"]]
        if mapped != notes["lens labels ours"]:
            raise AssertionError(f"different reading points: {notes['lens labels ours']} / {notes['lens labels tl']}")
    if "dla heads ours" in notes and notes["dla heads ours"] != notes["dla heads tl"]:
        raise AssertionError("the DLA sides split into different heads")


def hf_checkpoint() -> str:
    """GPT-2 small (``GPT2Config()``) with random weights, seeded, as a Hugging Face checkpoint directory."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    path = tempfile.mkdtemp(prefix="rs_interp_bench_tl_tools_")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--pos", type=int, default=8)
    ap.add_argument("--source", default="9.1", help="the direct path source head, LAYER.HEAD")
    ap.add_argument("--component", default="q", choices=list("qkv"))
    ap.add_argument("--edges", type=int, default=300, help="the faithfulness circuit's size (edges, at every position)")
    ap.add_argument("--lens-pos", type=int, default=64, help="tokens per sequence of the lens and DLA rows")
    ap.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    args = ap.parse_args()
    from rs_interp._backend import TL_MAJOR, TL_VERSION

    print(f"TransformerLens {TL_VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"GPT-2 small, random weights; {args.batch} pairs x {args.pos} tokens (faithfulness: the first pair; "
          f"lens and DLA: {args.batch} x {args.lens_pos}); "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    head = (f"{'row':<34} {'model':<6} {'ours first':>10} {'ours warm':>9} {'TL first':>8} {'TL warm':>8} "
            f"{'speed-up first':>14} {'warm':>6} {'ours peak':>9} {'TL peak':>9}  max |diff| (max |value|)")
    print(head)
    print("-" * len(head))
    hf_path = hf_checkpoint()
    notes: dict = {}
    try:
        for row in args.rows:
            name = ROWS[row] + (f" L{args.source.replace('.', 'H')} -> {args.component}" if row == "direct" else "")
            name += f" ({args.edges} edges)" if row == "faithfulness" else ""
            model = "random" if row in ("node", "lens", "dla", "composition") else "hf"
            if TL_MAJOR < 4 and row in MISSING_3:
                print(f"{name:<34} {model:<6} {'—':>10} {'—':>9} {'—':>8} {'—':>8}  {MISSING_3[row]}")
                continue
            with tempfile.TemporaryDirectory() as d:
                ours = run(row, "ours", args, hf_path, Path(d) / "ours.pt")
                theirs = run(row, "tl", args, hf_path, Path(d) / "tl.pt")
                a, b = torch.load(Path(d) / "ours.pt"), torch.load(Path(d) / "tl.pt")
            if not torch.equal(a.isnan(), b.isnan()):
                raise AssertionError(f"{row}: the two sides give numbers for different entries")
            ok = ~a.isnan()
            diff, scale = float((a[ok] - b[ok]).abs().max()), float(a[ok].abs().max())
            for side in (ours, theirs):
                timing = ("seconds", "first", "warm", "peak_extra_bytes")
                notes.update({k: v for k, v in side.items() if k not in timing})
            check_labels(notes)
            gb = lambda r: f"{max(r['peak_extra_bytes'], 0) / 2**30:7.2f} GB"  # noqa: E731
            print(f"{name:<34} {model:<6} {ours['first']:10.2f} {ours['warm']:9.2f} {theirs['first']:8.2f} "
                  f"{theirs['warm']:8.2f} {theirs['first'] / ours['first']:13.1f}x "
                  f"{theirs['warm'] / ours['warm']:5.1f}x {gb(ours)} {gb(theirs)}  {diff:.1e} ({scale:.2g})", flush=True)
    finally:
        shutil.rmtree(hf_path, ignore_errors=True)
    for k, v in notes.get("refused", {}).items():
        print(f"TransformerLens {TL_VERSION} on the native bridge (ri.load_gpt2('random')): {k}: {v}")
    if TL_MAJOR >= 4 and "direct" in args.rows:
        print("On a bridge over Hugging Face modules 4.3's start_at_layer still runs the blocks before it (their output "
              "discarded); our passes run the receiver's layer and the later ones alone (rs_interp._backend.tl4.run_from_layer), "
              "the edges into one layer stacked in one pass")
    if "edge entries" in notes:
        print(f"TransformerLens's edge scores: {notes['edge entries']} (edge, position) entries = our {notes['edges x positions']} edges x positions")
    if "faithfulness ours" in notes:
        (r0, c0, k0), (r1, c1, k1) = notes["faithfulness ours"], notes["faithfulness tl"]
        print(f"faithfulness: recovered {r0:.6f} (ours) {r1:.6f} (TransformerLens), clean metric {c0:.6g} / {c1:.6g}, corrupt {k0:.6g} / {k1:.6g}")
    if "lens" in args.rows:
        print("logit lens: TransformerLens's reading points k_pre (block k's input) = our L{k-1}, 0_pre = embed, "
              "final_post = our last L; " + ("4.3's logit_lens takes one selector per call: timed with targets "
              "(log-probabilities, entropy, ranks), not the top 5 that ours also returns" if TL_MAJOR >= 4 else
              "3.x has no logit_lens tool: the recipe (run_with_cache, accumulated_resid(apply_ln=True), unembed, "
              "log_softmax, the top 5, entropy and target) is timed"))
    if "W_U" in notes:
        mean, size, b_U = notes["W_U"]
        print(f"DLA: W_U centred over the vocabulary before both sides ran (max |W_U.mean(-1)| {mean:.1e} against "
              f"mean |W_U| {size:.1e}, max |b_U| {b_U:.0e}): our centred logit and TransformerLens's logit[target] "
              "are then the same number; compared per head, batch and position with a target")
    if TL_MAJOR < 4 and "direct" in args.rows:
        print("TransformerLens 3.9's direct path patching is a frozen-LayerNorm-scale linearisation: its difference is that approximation's error")


if __name__ == "__main__":
    main()
