#!/usr/bin/env python
"""Train the shipped transcoders of ``code-2l`` and write them with their metrics (issue 46).

Not run by CI or the tests (which read the shipped set): ``nice -n 19 python scripts/train_transcoders.py``
writes ``rs_interp/toy_models/transcoders/code-2l/`` (``layer_{i}.safetensors``, ``config.yaml`` in
circuit-tracer's format, and ``metrics.json``); ``--out DIR`` elsewhere, ``--dry`` to measure only.

Data, as code-2l itself was trained: windows of ``n_ctx`` tokens, half random windows of the training
split of its corpus (the pinned torch's Python sources, tokenized with its shipped tokenizer) and half
the toy models' repeated random sequences (:func:`rs_interp.induction_batch`), so the features cover
both what the model reads and the repeats its induction heads complete. The metrics are measured on
held-out windows of the same mixture (the corpus's held-out files, fresh repeated sequences).

One thread, a recorded seed: the run is reproducible on one machine (as the models' training is).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import rs_interp as ri  # noqa: E402
from rs_interp import _backend  # noqa: E402
from rs_interp.features import train_transcoder  # noqa: E402
from rs_interp.models.code_model import code_corpus, encode_corpus  # noqa: E402  (the corpus code-2l was trained on)

#: The shipped set's settings (``--help`` for each).
DEFAULTS = dict(d_transcoder=2048, activation="topk", k=32, skip=True, l1=3e-4, steps=4000, batch_size=1024, lr=2e-3, seed=0,
                n_windows=3000, n_eval=256)


def code_2l_data(n_windows: int, n_eval: int, seed: int) -> tuple:
    """code-2l, ``n_windows`` training rows and ``n_eval`` held-out rows of :func:`windows` (its corpus's
    train and held-out parts, from the seed ``seed + 7``) and the corpus."""
    model = ri.load_toy_model("code-2l")
    tokenizer = ri.models.SHIPPED_MODELS["code-2l"].tokenizer()
    corpus = code_corpus()
    train_stream, held_stream = encode_corpus(tokenizer, corpus.train), encode_corpus(tokenizer, corpus.heldout)
    width, vocab = model.cfg.n_ctx, model.cfg.d_vocab
    g = torch.Generator().manual_seed(seed + 7)
    return model, windows(train_stream, n_windows, width, vocab, g), windows(held_stream, n_eval, width, vocab, g), corpus


def windows(stream: torch.Tensor, n: int, width: int, d_vocab: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` rows: half random windows of ``stream``, half repeated random sequences."""
    k = n // 2
    starts = torch.randint(0, len(stream) - width, (n - k,), generator=generator)
    code = stream[starts[:, None] + torch.arange(width)]
    periodic = ri.induction_batch(k, generator=generator, d_vocab=d_vocab, seq_len=width).tokens
    return torch.cat([periodic, code])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "rs_interp" / "toy_models" / "transcoders" / "code-2l")
    p.add_argument("--dry", action="store_true", help="train and measure, write nothing")
    for name, value in DEFAULTS.items():
        if isinstance(value, bool):
            p.add_argument("--" + name.replace("_", "-"), action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    start = time.time()
    model, train, held, corpus = code_2l_data(args.n_windows, args.n_eval, args.seed)
    width = model.cfg.n_ctx
    trained = train_transcoder(model, train, d_transcoder=args.d_transcoder, activation=args.activation,
                               k=args.k if args.activation == "topk" else None, l1=args.l1, skip=args.skip, steps=args.steps,
                               batch_size=args.batch_size, lr=args.lr, seed=args.seed, eval_tokens=held, progress=True)
    seconds = round(time.time() - start, 1)
    m = trained.metrics
    print(f"{seconds} s: FVU {[round(v, 4) for v in m.fvu]}, L0 {[round(v, 1) for v in m.l0]}, dead "
          f"{[round(v, 4) for v in m.dead]}, KL {m.kl:.4f} nats, loss {m.loss:.4f} -> {m.replacement_loss:.4f}")
    if args.dry:
        return 0

    tset = dataclasses.replace(trained.transcoders, scan="rs_interp/code-2l-transcoders")
    tset.save(args.out)
    record = {
        "model": "code-2l",
        "metrics": m.as_dict(),
        "measured_on": f"{args.n_eval} held-out windows of {width} tokens: half held-out code, half repeated random sequences",
        "settings": {k: getattr(args, k) for k in DEFAULTS} | {"width": width, "loss": "FVU + l1 * sum a ||W_dec|| (relu only)"},
        "curves": {"every_steps": max(1, args.steps // 100), "fvu": [list(c) for c in trained.curves]},
        "corpus_sha256": corpus.sha256,
        "seconds": seconds,
        "versions": {"torch": torch.__version__, "transformer_lens": _backend.TL_VERSION,
                     "rs_interp": importlib.metadata.version("rs_interp")},
    }
    (args.out / "metrics.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
