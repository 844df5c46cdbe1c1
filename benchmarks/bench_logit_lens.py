"""Logit lens on GPT-2 small (random weights) over a sweep of batch x pos: rs_interp vs
TransformerLens's recipe, and under TransformerLens 4.x vs its own ``tools.analysis.logit_lens``.

Every size reads the 13 reading points (after the embedding and after each block) at every
position, with next-token targets (the last position has none: skipped, NaN on our side), and each
(size, tool) runs in its own subprocess (its own peak RSS above the loaded model, the high-water
mark reset after loading). The tools:

- ours: ``ri.logit_lens(model, tokens, targets=ri.next_token_targets(tokens), k=5)`` (top 5,
  entropy and the target's probability at every reading point);
- recipe: ``model.run_with_cache`` (the residual hooks only), ``cache.accumulated_resid(apply_ln=True)``
  (each point normalised with its own recomputed scale), ``model.unembed``, ``log_softmax``, then the
  same three readings (``topk(5)``, ``-(p * log p).sum``, the target's probability). It holds
  (point, batch, pos, d_vocab) floats several times over (the logits, the log-probabilities, and two
  more for the entropy): 13 x 16 x 1024 x 50257 x 4 B ~ 43 GB each at 16 x 1024;
- 4.3 tool (TransformerLens 4.x only): ``tools.analysis.logit_lens(model, tokens, positions=None,
  targets=..., return_type="log_probs")``, exponentiated. It takes one selector per call (targets,
  ``top_k`` or ``vocab``), so this one call gives the target's log-probability, the entropy and the
  target's rank but not the top 5, which a second call would add: its time is a lower bound for our
  readings. It also checks its last reading point against the model's own logits (one more
  unembedding of the last point), part of its time. It reads 64 rows at a time, but its resident
  memory grows with the rows read: glibc keeps the freed (64, 50257) blocks (``malloc_trim(0)``
  after the call gives them back), several GB at 16 x 64 on some runs and over 24 GB (killed) in one
  call at 16 x 1024 here.

Both TransformerLens tools run the way a user would where one call cannot fit: a loop over chunks of
``max(1, --chunk-tokens // pos)`` sequences (marked ``*``), each call's results kept and its cache
dropped; ``--chunk-tokens`` (default 1024: the recipe's 13 x 1024 x 50257 x 4 B = 2.7 GB a copy) is
the largest that fits beside other work here, and sizes up to it run in one call. Every child runs
under an address-space limit (``--memory-cap``, GB) so that a tool which outgrows the machine fails
alone (shown as ``over cap``) instead of waking the kernel's OOM killer on a shared machine.

The difference columns are the max abs difference of the target's probabilities over every
(reading point, batch, pos) with a target, against ours; the reading points are matched by the
tensor they read (TransformerLens's ``k_pre`` is block k's input, our ``L{k-1}``; ``0_pre`` our
``embed``; ``final_post`` our last ``L``), and the script checks that both sides read the same set.

Goals (issues 4 and 32): peak extra memory under 1 GB at 8 x 1024 (our forward passes are the same
size at 16 x 1024: sequences go through ``memory_budget`` at a time), and the lens at least as fast
as TransformerLens's recipe at every batch size from 1 x 16 to 16 x 1024 (speed-up >= 1).

The machine's other work makes times noisy: the header prints the load average, and each size's
tools run one after the other, so the speed-ups of one row are measured side by side.

Usage: python benchmarks/bench_logit_lens.py [--sizes 1x16 1x128 1x1024 4x256 16x64 16x1024] [--chunk-tokens 1024]
    [--memory-cap 16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _child import EPILOGUE, PRELUDE, START

_SETUP = r"""
from rs_interp import _backend
tool, batch, pos, chunk_tokens, result = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model = ri.load_gpt2("random")
tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))
targets = ri.next_token_targets(tokens)  # -1 at the last position: skipped (NaN in ours)
resid = lambda n: n.endswith(("hook_resid_pre", "hook_resid_post"))  # what accumulated_resid reads
"""

_BODY = r"""
out = {}
if tool == "ours":
    lens = ri.logit_lens(model, tokens, targets=targets, k=5)
    probs, labels = lens.target_probs, list(lens.labels)
else:
    if tool == "tl":
        from transformer_lens.tools.analysis import logit_lens as tl_logit_lens
    step = max(1, chunk_tokens // pos)  # sequences per call: the whole batch where it fits
    parts = []
    for b0 in range(0, batch, step):
        tk, tg = tokens[b0 : b0 + step], targets[b0 : b0 + step].clamp(min=0)
        if tool == "tl":
            res = tl_logit_lens(model, tk, positions=None, targets=tg, return_type="log_probs")
            parts.append(res.values[..., 0].exp())
            labels = list(res.labels)
            del res
            continue
        _, cache = model.run_with_cache(tk, names_filter=resid)
        stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
        del cache
        lp = model.unembed(stack).log_softmax(-1)
        del stack
        top = lp.topk(5, dim=-1)
        entropy = -(lp.exp() * lp).sum(-1)
        parts.append(lp.gather(-1, tg[None, ..., None].expand(lp.shape[0], -1, -1, 1))[..., 0].exp())
        del lp
    probs = torch.cat(parts, 1)
    out["chunk"] = step
"""

#: After the timing (EPILOGUE has printed it): the target's probabilities, NaN where there is no target.
_POST = r"""
probs = probs.double().clone()
probs[:, targets < 0] = float("nan")
torch.save({"probs": probs, "labels": labels}, result)
"""

SIZES = ["1x16", "1x128", "1x1024", "4x256", "16x64", "16x1024"]


def ours_label(label: str, n_layers: int) -> str:
    """A TransformerLens ``accumulated_resid`` label as our reading point's label (the same tensor)."""
    if label == "final_post":
        return f"L{n_layers - 1}"
    k = int(label.removesuffix("_pre"))
    return "embed" if k == 0 else f"L{k - 1}"


#: How an allocation refused under the address-space limit ends a child.
_NO_MEMORY = ("can't allocate memory", "MemoryError", "std::bad_alloc", "Cannot allocate memory")


def run(tool: str, batch: int, pos: int, chunk_tokens: int, cap_bytes: int, result: Path) -> dict | None:
    """One child: PRELUDE + setup, the timed body, EPILOGUE (time and peak), then _POST (saves the
    numbers); None if it ran out of its address space (``cap_bytes``)."""
    code = PRELUDE + _SETUP + START + _BODY + EPILOGUE + _POST
    argv = [tool, batch, pos, chunk_tokens, result]
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))  # noqa: E731
    done = subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True, preexec_fn=limit)
    if done.returncode:
        if any(s in done.stderr for s in _NO_MEMORY):
            return None
        raise RuntimeError(f"{tool} at {batch} x {pos} failed:\n{done.stderr[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def compare(ours: dict, theirs: dict | None, n_layers: int) -> str:
    """Max abs difference of the target's probabilities, reading points matched by label."""
    if theirs is None:
        return "—"
    mapped = [ours_label(lab, n_layers) for lab in theirs["labels"]]
    if mapped != ours["labels"]:
        raise AssertionError(f"different reading points: ours {ours['labels']}, TransformerLens {theirs['labels']}")
    a, b = ours["probs"], theirs["probs"]
    if not torch.equal(a.isnan(), b.isnan()):
        raise AssertionError("the two sides give probabilities for different entries")
    ok = ~a.isnan()
    return f"{float((a[ok] - b[ok]).abs().max()):.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=SIZES, help="batch x pos pairs")
    ap.add_argument("--chunk-tokens", type=int, default=1024,
                    help="TransformerLens's tokens per call (sequences per call: max(1, this // pos))")
    ap.add_argument("--memory-cap", type=float, default=16, help="each child's address-space limit, GB")
    args = ap.parse_args()
    from rs_interp._backend import TL_MAJOR, TL_VERSION

    tools = ["ours", "recipe"] + (["tl"] if TL_MAJOR >= 4 else [])
    n_layers = 12
    print(f"TransformerLens {TL_VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads; GPT-2 small, "
          f"random weights; each child capped at {args.memory_cap:g} GB of address space; "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    head = f"{'batch x pos':>11} {'ours s':>7} {'ours peak':>9} {'recipe s':>9} {'recipe peak':>11} {'x ours':>6}"
    head += f" {'4.3 s':>8} {'4.3 peak':>9} {'x ours':>6}" if "tl" in tools else ""
    head += "  max |diff| recipe" + (", 4.3" if "tl" in tools else "") + " (max p)"
    print(head)
    print("-" * len(head))
    chunked, largest = {}, None

    def cells(r: dict | None, ours: dict) -> str:
        if r is None:
            return f"{'over cap':>9} {'—':>11} {'—':>6}"
        star = "*" if r["chunk"] < batch else " "
        return f"{r['seconds']:8.2f}{star} {max(r['peak_extra_bytes'], 0) / 2**30:8.2f} GB {r['seconds'] / ours['seconds']:5.2f}x"

    for size in args.sizes:
        batch, pos = (int(x) for x in size.split("x"))
        res, saved = {}, {}
        with tempfile.TemporaryDirectory() as d:
            for tool in tools:
                res[tool] = run(tool, batch, pos, args.chunk_tokens, int(args.memory_cap * 2**30), Path(d) / f"{tool}.pt")
                saved[tool] = None if res[tool] is None else torch.load(Path(d) / f"{tool}.pt")
        ours = res["ours"]
        if ours is None:
            raise RuntimeError(f"rs_interp's lens at {size} went over the {args.memory_cap:g} GB cap")
        diffs = [compare(saved["ours"], saved[t], n_layers) for t in tools[1:]]
        for t in tools[1:]:
            if res[t] is not None and res[t]["chunk"] < batch:
                chunked.setdefault(size, res[t]["chunk"])
        line = f"{size:>11} {ours['seconds']:7.2f} {max(ours['peak_extra_bytes'], 0) / 2**30:6.2f} GB {cells(res['recipe'], ours)}"
        if "tl" in tools:
            line += f" {cells(res['tl'], ours)}"
        top = float(saved["ours"]["probs"].nan_to_num().max())
        print(f"{line}  {', '.join(diffs)} ({top:.2g})", flush=True)
        if largest is None or batch * pos >= largest[0] * largest[1]:
            largest = (batch, pos, ours["peak_extra_bytes"])
    print("x ours: the tool's time over ours (>= 1: ours at least as fast); peaks are above the loaded model")
    if chunked:
        print(f"* in a loop over chunks of at most {args.chunk_tokens} tokens, as a user would where one call cannot fit: "
              + "; ".join(f"{k} as {batch // v} calls of {v} sequence(s)" for k, v in chunked.items()
                          for batch in [int(k.split("x")[0])]))
    if "tl" in tools:
        print("4.3's logit_lens takes one selector per call: timed with targets (log-probabilities, entropy, ranks), "
              "without the top 5 that ours also returns")
    if largest is not None:
        b, p, peak = largest
        print(f"ours' peak extra memory at {b} x {p}: {peak / 2**30:.2f} GB (goal < 1 GB at 8 x 1024)")


if __name__ == "__main__":
    main()
