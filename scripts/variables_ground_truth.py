#!/usr/bin/env python
"""The tracr ground truth of rs_interp.variables, measured: the table of docs/capabilities/variables.md.

For every RASP variable of every shipped tracr program (those some later component reads): the interchange on
tracr's own dimensions at the stream after the component that writes it and before it, and DAS at the
variable's rank from a random start (held-out accuracy, projection kernel with tracr's identifiable subspace
as a fraction of the rank) with its controls (arbitrary labels, an untrained copy). DAS's settings are the slow
test's (tests/variables/test_das.py): 100 pairs of length 5 (reverse's length: every length), every position
where the variable's whole value can differ between inputs as long (else one position at a time), only the
reads the interchange changes, the squared loss, 20 epochs, lr 0.02, batch 64, seed 0; ``--loss cross_entropy``
for TransformerLens's loss; ``--tempered`` for the table's second DAS column: the queries of every later
attention scaled by 0.001 at the start and annealed to 1 over three quarters of the steps, the learning rate
decayed to 0 by a cosine, batches of 8 (``TEMPERED``).

Usage: python scripts/variables_ground_truth.py [--loss squared|cross_entropy] [--tempered] [--only tracr-hist ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import rs_interp as ri  # noqa: E402
from rs_interp.circuits.tracr import TRACR_PROGRAMS  # noqa: E402
from rs_interp.variables import DASOptions, das, interchange, tracr_pairs, tracr_variables  # noqa: E402

#: The tempered fit's options beyond the slow test's (``--tempered``).
TEMPERED = {"temper": 0.001, "schedule": "cosine", "batch_size": 8}


def pairs_for(name: str, var, seed: int, n: int):
    lengths = None if var.name == "length_5" else [5]
    try:
        return tracr_pairs(name, var.name, n=n, seed=seed, lengths=lengths, every_position=True, changed_only=True), True
    except ValueError:  # the whole value never differs between inputs as long (indices, length)
        return tracr_pairs(name, var.name, n=n, seed=seed, lengths=lengths, changed_only=True), False


def row(name: str, var, loss: str, extra: dict) -> str:
    model = ri.load_toy_model(name)
    basis = var.basis(model.cfg.d_model)
    check, every = pairs_for(name, var, seed=1, n=40)
    at = interchange(model, check, var.site, basis, progress=False)
    before = "-" if var.before is None else f"{interchange(model, check, var.before, basis, progress=False).accuracy:.2f}"
    pairs, _ = pairs_for(name, var, seed=0, n=100)
    train, test = pairs.split(0.25)
    start = time.perf_counter()
    options = DASOptions(rank=var.rank, epochs=20, lr=0.02, loss=loss, **extra)
    fit = das(model, train, var.site, options, test=test, progress=False)
    pk = float(var.kernel(fit.basis).score) / var.rank
    controls = " / ".join(f"{c.accuracy:.2f}" for c in fit.controls.values())
    return (f"| {name.removeprefix('tracr-')} | `{var.name}` | {var.writer} | `{var.site.hook}` | {len(var.dims)} | {var.rank} "
            f"| {'every' if every else 'one'} | {at.accuracy:.2f} | {before} | {at.null_accuracy:.2f} | {fit.accuracy:.2f} "
            f"| {pk:.2f} | {controls} |  <!-- {time.perf_counter() - start:.0f} s -->")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="squared", choices=("squared", "cross_entropy"))
    ap.add_argument("--tempered", action="store_true", help="DAS with the options TEMPERED")
    ap.add_argument("--only", nargs="+", default=list(TRACR_PROGRAMS))
    args = ap.parse_args()
    print("| program | variable | writer | site | dims | rank | positions | interchange | before | null | DAS "
          "| DAS kernel / rank | controls (arbitrary / untrained) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.only:
        for var in tracr_variables(name).values():
            if var.rank:
                print(row(name, var, args.loss, TEMPERED if args.tempered else {}), flush=True)


if __name__ == "__main__":
    main()
