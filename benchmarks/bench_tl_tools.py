"""rs_interp beside TransformerLens's own analysis tools (``transformer_lens.tools.analysis``), on
GPT-2 small with random weights, 16 clean/corrupt pairs of 8 tokens, a per-example logit difference
at the last position averaged over the batch. Each (row, tool) runs in its own subprocess (its own peak
RSS above the loaded model, its high-water mark reset after loading); the numbers each side returns are compared here, conventions mapped
(TransformerLens: denoising, per position, averaged over pairs; rs_interp: run = corrupt,
reference = clean, summed over positions and over the batch of the mean metric).

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
  re-runs the circuit once per edge class it holds), the recovered fraction and the circuit's metric.

TransformerLens 4.3 refuses edges, faithfulness and direct path patching on the native bridge that
``ri.load_gpt2("random")`` builds (``NativeAttention`` has no per-head result or split q/k/v inputs:
NotImplementedError, checked in the node row's child and printed under the table); those rows run,
for both sides, on a bridge over Hugging Face GPT-2 small attention with random weights (``hf``:
a ``GPT2LMHeadModel(GPT2Config())`` seeded 0, saved to a temporary directory and loaded unfolded
with ``ri.load_gpt2(path, fold_ln=False)``; 3.x loads the same checkpoint as a HookedTransformer).
TransformerLens 3.9 has node attribution and direct path patching only, and its direct path patching
is a frozen-LayerNorm-scale linearisation, not the exact patch (``tests/test_tl_tools.py``): its
difference column is that approximation's error.

Model column: ``random`` is ``ri.load_gpt2("random")``, ``hf`` the Hugging Face checkpoint. TransformerLens
scores each pair in passes of its own, so its time hardly depends on ``--pos``; 8 tokens keep the
script to about 6 minutes under 4.x and 3 under 3.x on 2 cores (16 and 5 when other work shares them:
the header prints the load average).

Usage: python benchmarks/bench_tl_tools.py [--batch 16] [--pos 8] [--source 9.1] [--component q] [--edges 300]
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
from transformer_lens.tools.analysis import attribution_patching as tl
from rs_interp import _backend
TL4 = _backend.TL_MAJOR >= 4
row, side, batch, pos, hf_path, result = sys.argv[1:7]
batch, pos = int(batch), int(pos)
src_l, src_h = (int(v) for v in sys.argv[7].split("."))
component, n_keep = sys.argv[8], int(sys.argv[9])
warnings.filterwarnings("ignore")
model = ri.load_gpt2("random", size="small") if row == "node" else ri.load_gpt2(hf_path, fold_ln=False)
L, H = model.cfg.n_layers, model.cfg.n_heads
g = torch.Generator().manual_seed(0)
clean = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
corrupt = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
metric = lambda logits: (logits[:, -1, 42] - logits[:, -1, 43]).mean()  # per pair; the batch mean
layout = ri.edge_layout(model)
if row == "faithfulness":  # one pair; the circuit: our edge estimate's top edges on it (untimed, both sides)
    clean, corrupt = clean[:1], corrupt[:1]
    circuit = sorted(ri.top_edges(ri.edge_attribution_patching(model, corrupt, metric, reference=clean), n_keep))
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

def direct_path_tool():
    if TL4:
        from transformer_lens.patching import get_act_patch_direct_path
    else:
        from transformer_lens.tools.analysis import get_act_patch_direct_path
    return get_act_patch_direct_path
"""

_BODY = r"""
if side == "ours":
    if row == "node":
        res = ri.attribution_patching(model, corrupt, metric, reference=clean)
    elif row == "edge":
        res = ri.edge_attribution_patching(model, corrupt, metric, reference=clean)
    elif row == "direct":
        res = ri.path_patching(model, corrupt, metric, reference=clean, edges=direct_edges)
    else:
        kept = ri.evaluate_circuit(model, clean, metric, circuit, reference=corrupt)
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
else:
    if row == "node":
        with torch.enable_grad():
            res = tl.attribution_patch(model, clean, corrupt, metric)
    elif row == "edge":
        with torch.enable_grad():
            res = tl.attribution_patch(model, clean, corrupt, metric, tl.EdgeAttributionConfig(granularity="edge"))
    elif row == "direct":
        _, cc = model.run_with_cache(clean)
        _, kc = model.run_with_cache(corrupt)
        res = direct_path_tool()(model, corrupt, cc, kc, metric, src_l, src_h, component, verbose=False)
        del cc, kc
    else:
        res = tl.faithfulness(model, clean, corrupt, metric,
                              [(node(s, p, False), node(r, p, True)) for s, r in circuit for p in range(pos)])
out = {}
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
elif row == "direct":
    if side == "ours":
        values = torch.tensor([res.edge(*e) for e in direct_edges], dtype=torch.float64)
    else:
        with torch.no_grad():
            m_corrupt = float(metric(model(corrupt)))
        values = torch.tensor([float(res[l, h]) - m_corrupt for l, h in dests], dtype=torch.float64)
else:  # the recovered fraction and the circuit's metric
    if side == "ours":
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
}
#: What TransformerLens 3.9 lacks, per row.
MISSING_3 = {"edge": "TransformerLens 3.9: attribution_patch has no edge granularity",
             "faithfulness": "TransformerLens 3.9: tools.analysis has no faithfulness"}


def run(row: str, side: str, args, hf_path: str, result: Path) -> dict:
    """One child: PRELUDE + setup, the timed body, EPILOGUE (time and peak), then _POST (saves the numbers)."""
    code = PRELUDE + _SETUP + START + _BODY + EPILOGUE + _POST
    argv = [row, side, args.batch, args.pos, hf_path, result, args.source, args.component, args.edges]
    done = subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{row} {side} failed:\n{done.stderr[-3000:]}")
    out: dict = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            out.update(json.loads(line))
    return out


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
    ap.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    args = ap.parse_args()
    from rs_interp._backend import TL_MAJOR, TL_VERSION

    print(f"TransformerLens {TL_VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"GPT-2 small, random weights; {args.batch} pairs x {args.pos} tokens (faithfulness: the first pair); "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    head = f"{'row':<34} {'model':<6} {'ours s':>7} {'TL s':>8} {'speed-up':>8} {'ours peak':>9} {'TL peak':>9}  max |diff| (max |value|)"
    print(head)
    print("-" * len(head))
    hf_path = hf_checkpoint()
    notes: dict = {}
    try:
        for row in args.rows:
            name = ROWS[row] + (f" L{args.source.replace('.', 'H')} -> {args.component}" if row == "direct" else "")
            name += f" ({args.edges} edges)" if row == "faithfulness" else ""
            model = "random" if row == "node" else "hf"
            if TL_MAJOR < 4 and row in MISSING_3:
                print(f"{name:<34} {model:<6} {'—':>7} {'—':>8}  {MISSING_3[row]}")
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
                notes.update({k: v for k, v in side.items() if k not in ("seconds", "peak_extra_bytes")})
            gb = lambda r: f"{max(r['peak_extra_bytes'], 0) / 2**30:7.2f} GB"  # noqa: E731
            print(f"{name:<34} {model:<6} {ours['seconds']:7.2f} {theirs['seconds']:8.2f} {theirs['seconds'] / ours['seconds']:7.1f}x "
                  f"{gb(ours)} {gb(theirs)}  {diff:.1e} ({scale:.2g})", flush=True)
    finally:
        shutil.rmtree(hf_path, ignore_errors=True)
    for k, v in notes.get("refused", {}).items():
        print(f"TransformerLens {TL_VERSION} on the native bridge (ri.load_gpt2('random')): {k}: {v}")
    if TL_MAJOR >= 4 and "direct" in args.rows:
        print("On a bridge over Hugging Face modules 4.3's start_at_layer still runs the blocks before it (their output "
              "discarded), so each of our direct path passes costs a whole forward there")
    if "edge entries" in notes:
        print(f"TransformerLens's edge scores: {notes['edge entries']} (edge, position) entries = our {notes['edges x positions']} edges x positions")
    if "faithfulness ours" in notes:
        (r0, c0, k0), (r1, c1, k1) = notes["faithfulness ours"], notes["faithfulness tl"]
        print(f"faithfulness: recovered {r0:.6f} (ours) {r1:.6f} (TransformerLens), clean metric {c0:.6g} / {c1:.6g}, corrupt {k0:.6g} / {k1:.6g}")
    if TL_MAJOR < 4 and "direct" in args.rows:
        print("TransformerLens 3.9's direct path patching is a frozen-LayerNorm-scale linearisation: its difference is that approximation's error")


if __name__ == "__main__":
    main()
