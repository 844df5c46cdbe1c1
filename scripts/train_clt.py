#!/usr/bin/env python
"""Train a small cross-layer transcoder for ``code-2l`` and write it in circuit-tracer's CLT layout (issue 54).

Not run by CI or the tests: ``nice -n 19 python scripts/train_clt.py`` writes
``rs_interp/toy_models/transcoders/code-2l-clt/`` (``W_enc_{i}.safetensors``, ``W_dec_{i}.safetensors``,
``config.yaml``, ``metrics.json``); ``--out DIR`` elsewhere, ``--dry`` to measure only. The data are
those of ``scripts/train_transcoders.py`` (half code windows of code-2l's corpus, half repeated random
sequences; held-out windows of the same mixture for the metrics). One thread, a recorded seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from train_transcoders import code_2l_data  # noqa: E402  (the shipped per-layer set's data)

from rs_interp.features import train_clt  # noqa: E402

DEFAULTS = dict(d_transcoder=1024, activation="topk", k=16, l1=3e-4, steps=2000, batch_size=1024, lr=2e-3, seed=0,
                n_windows=2000, n_eval=256)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "rs_interp" / "toy_models" / "transcoders" / "code-2l-clt")
    p.add_argument("--dry", action="store_true", help="train and measure, write nothing")
    for name, value in DEFAULTS.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    start = time.time()
    model, train, held, corpus = code_2l_data(args.n_windows, args.n_eval, args.seed)
    width = model.cfg.n_ctx
    t = train_clt(model, train, d_transcoder=args.d_transcoder, activation=args.activation, k=args.k, l1=args.l1, steps=args.steps,
                  batch_size=args.batch_size, lr=args.lr, seed=args.seed, eval_tokens=held)
    seconds = round(time.time() - start, 1)
    print(f"{seconds} s: held-out FVU per output layer {[round(v, 4) for v in t.fvu]}")
    if args.dry:
        return 0
    dataclasses.replace(t.clt, scan="rs_interp/code-2l-clt").save(args.out)
    record = {"model": "code-2l", "fvu": list(t.fvu), "curve": list(t.curve), "seconds": seconds,
              "settings": {k: getattr(args, k) for k in DEFAULTS} | {"width": width},
              "measured_on": f"{args.n_eval} held-out windows of {width} tokens: half held-out code, half repeated random sequences",
              "corpus_sha256": corpus.sha256, "versions": {"torch": torch.__version__}}
    (args.out / "metrics.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
