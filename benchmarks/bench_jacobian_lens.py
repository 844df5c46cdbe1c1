"""The Jacobian lens beside TransformerLens 4.3's own (issue 62), on GPT-2 small's shape with random weights.

One random Hugging Face GPT-2 checkpoint (``GPT2Config`` with ``--layers`` blocks of GPT-2 small's width: 768 wide,
12 heads, 3072 MLP, 50257 tokens; a word-level tokenizer of its 50257 ids, ``t0`` ... , so a prompt of ``--pos - 1``
words is ``--pos`` tokens with the BOS) is written once; then each side runs in its own subprocess (its own peak RSS
above the loaded model, the high-water mark reset after loading):

- TransformerLens 4.3: ``TransformerBridge.boot_transformers(dir)`` (a raw bridge, what its lens requires), then
  ``JacobianLens.fit(bridge, prompts, corpus=...)`` with its defaults (``dim_batch=8``, 16 positions skipped,
  ``max_seq_len=128``);
- rs_interp: ``ri.load_pretrained(dir, fold_ln=False)`` (the same raw weights; compatibility mode on 4.x), then
  ``ri.fit_jacobian_lens(model, prompts)`` with its defaults (the same estimator and settings).

Both fit every source layer on the same ``--prompts`` prompts. The table gives each side's wall and CPU seconds
(``time.process_time``, robust to the machine's other work: the ratio is of CPU seconds) and peak memory, and
compares what they return: the fitted matrices (max abs difference over max abs entry: float32 rounding), the
readout of the first prompt (the top 5 tokens at every source layer and position: TransformerLens's ``readout``
against ``ri.jacobian_lens``), and J-space decompositions of three of its activations at the middle layer (support
and coordinates: ``lens.decompose`` against ``ri.readouts.jspace_decomposition``).

Goal (issue 62): the matrices equal to float32 rounding, readouts and decompositions equal, the fit at least 3x
faster (CPU seconds) at no more peak memory.

Usage: .venv-tl4/bin/python benchmarks/bench_jacobian_lens.py [--prompts 16] [--pos 128] [--layers 12]
    [--threads 1] [--json PATH]
The full run (16 x 128, 12 layers) takes hours of CPU on one thread for each side; ``--prompts 1 --pos 48`` checks
the ratio and the equalities in minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _child import EPILOGUE, PRELUDE, START

_SETUP = r"""
import os
folder, out_path = sys.argv[1], sys.argv[5]
n_prompts, pos, threads = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(1)
prompts = [" ".join(f"t{int(i)}" for i in torch.randint(1, 50256, (pos - 1,), generator=g)) for _ in range(n_prompts)]
"""

_TL = r"""
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis import JacobianLens
model = TransformerBridge.boot_transformers(folder, device="cpu")
model.eval()
""" + START + r"""
cpu = time.process_time()
lens = JacobianLens.fit(model, prompts, corpus="bench", show_progress=False)
out = {"cpu_seconds": time.process_time() - cpu}
""" + EPILOGUE + r"""
layers = lens.source_layers
mid = layers[len(layers) // 2]
read = lens.readout(model, prompts[0], top_k=5)
decs = [lens.decompose(model, prompts[0], mid, position=p) for p in (20, pos // 2, pos - 2)]
torch.save({"J": {l: lens.jacobians[l] for l in layers}, "top": {l: read.lens_topk_indices[l] for l in layers},
            "dec": [(d.support, d.coordinates) for d in decs], "mid": mid}, out_path)
"""

_OURS = r"""
model = ri.load_pretrained(folder, fold_ln=False)
tokens = [model.to_tokens(p)[0] for p in prompts]
""" + START + r"""
cpu = time.process_time()
lens = ri.fit_jacobian_lens(model, tokens, progress=False)
out = {"cpu_seconds": time.process_time() - cpu}
""" + EPILOGUE + r"""
layers = lens.source_layers
mid = layers[len(layers) // 2]
read = ri.jacobian_lens(model, tokens[0], lens, k=5)
decs = [ri.readouts.jspace_decomposition(model, lens, tokens[0], mid, position=p) for p in (20, pos // 2, pos - 2)]
top = {l: read.top_tokens[1 + i, 0] for i, l in enumerate(layers)}  # point 0 is the embedding
torch.save({"J": {l: lens.matrix(l) for l in layers}, "top": top, "dec": [(d.support, d.coordinates) for d in decs],
            "mid": mid}, out_path)
"""


def _checkpoint(folder: Path, layers: int) -> None:
    """GPT-2 small's shape, random weights (transformers' initialisation, seeded), and a word-level tokenizer."""
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers)).eval().save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(50256)} | {"[UNK]": 50256}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="t0", eos_token="t0")
    fast.save_pretrained(folder)


def _run(body: str, *args: object) -> dict:
    done = subprocess.run([sys.executable, "-c", PRELUDE + _SETUP + body, *map(str, args)], capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compare(tl: dict, ours: dict) -> dict:
    J = max(float((ours["J"][l] - tl["J"][l]).abs().max() / tl["J"][l].abs().max()) for l in tl["J"])
    top1 = sum(int((ours["top"][l][:, 0] == tl["top"][l][:, 0]).sum()) for l in tl["top"])
    cells = sum(tl["top"][l].shape[0] for l in tl["top"])
    top5 = all(torch.equal(ours["top"][l], tl["top"][l]) for l in tl["top"])
    supports = all(torch.equal(a[0], b[0]) for a, b in zip(ours["dec"], tl["dec"]))
    coords = max(float((a[1].float() - b[1].float()).abs().max()) if a[1].numel() else 0.0
                 for a, b in zip(ours["dec"], tl["dec"]) if a[0].shape == b[0].shape) if supports else float("nan")
    return {"matrices_rel_diff": J, "readout_top1_equal": f"{top1}/{cells}", "readout_top5_equal": top5,
            "decomposition_supports_equal": supports, "decomposition_coordinates_diff": coords}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--pos", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gpt2"
        _checkpoint(folder, args.layers)
        rows, saved = {}, {}
        for name, body in (("TransformerLens 4.3", _TL), ("rs_interp", _OURS)):
            path = Path(tmp) / f"{name.split()[0]}.pt"
            rows[name] = _run(body, folder, args.prompts, args.pos, args.threads, path)
            saved[name] = torch.load(path, weights_only=True)
            print(name, json.dumps(rows[name]), flush=True)
    tl, ours = rows["TransformerLens 4.3"], rows["rs_interp"]
    shape = f"{args.layers} layers x 768, {args.prompts} prompts x {args.pos} tokens, {args.threads} thread(s)"
    summary = {"shape": shape, "speed_up_cpu": tl["cpu_seconds"] / ours["cpu_seconds"],
               "speed_up_wall": tl["seconds"] / ours["seconds"],
               "memory_ratio": ours["peak_extra_bytes"] / tl["peak_extra_bytes"], "rows": rows,
               **_compare(saved["TransformerLens 4.3"], saved["rs_interp"])}
    print("\n| tool | CPU s | wall s | peak extra MB |\n|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['cpu_seconds']:.1f} | {r['seconds']:.1f} | {r['peak_extra_bytes'] / 2**20:.0f} |")
    print({k: v for k, v in summary.items() if k != "rows"})
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
