#!/usr/bin/env python
"""The tracr ground truth of rs_interp.variables, measured: the table of docs/capabilities/variables.md.

For every RASP variable of every shipped tracr program (those some later component reads): the interchange on
tracr's own dimensions at the stream after the component that writes it and before it, and DAS at the rank the
training pairs identify (``TracrVariable.identified``: the variable's rank but for sort's sequence_map_5, 15 of 19)
from a random start (held-out accuracy, projection kernel with that identified subspace as a fraction of its rank,
counting what later components read, and in brackets the whole kernel, no unread part dropped) with its controls
(arbitrary labels, an untrained copy). DAS's settings are the slow test's (tests/variables/test_das.py): 100 pairs
of length 5 (reverse's length: every length), every position where the variable's whole value can differ between
inputs as long (else one position at a time), only the reads the interchange changes, the squared loss, 20 epochs,
lr 0.02, batch 64, seed 0; ``--loss cross_entropy`` for TransformerLens's loss; ``--tempered`` for the table's
second DAS column: the queries of every later attention scaled by 0.001 at the start and annealed to 1 over three
quarters of the steps, the learning rate decayed to 0 by a cosine, batches of 8 (``TEMPERED``); ``--all-reads``:
DAS trained and scored on every read, the unchanged ones too; ``--start mean_difference``: DAS started at the
class means' span (``mean_difference_start``) with ``MEAN_DIFFERENCE``'s options, each control from a start of the
same kind, the starts' kernels printed before DAS's.

Usage: python scripts/variables_ground_truth.py [--loss squared|cross_entropy] [--tempered | --start mean_difference]
       [--all-reads] [--only tracr-hist ...] [--variables tokens ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dataclasses import replace  # noqa: E402

import torch  # noqa: E402

import rs_interp as ri  # noqa: E402
from rs_interp.circuits.tracr import TRACR_PROGRAMS  # noqa: E402
from rs_interp.variables import (  # noqa: E402
    DASOptions,
    arbitrary_labels,
    das,
    interchange,
    orthonormal_basis,
    tracr_causal_model,
    tracr_pairs,
    tracr_variables,
    untrained_copy,
)
from rs_interp.variables._runs import chunks, inputs, record  # noqa: E402

#: The tempered fit's options beyond the slow test's (``--tempered``).
TEMPERED = {"temper": 0.001, "schedule": "cosine", "batch_size": 8}
#: The class-mean start's options beyond the slow test's (``--start mean_difference``): a smaller rate, decayed,
#: as a start near the answer needs.
MEAN_DIFFERENCE = {"lr": 0.002, "schedule": "cosine"}


def pairs_for(name: str, var, seed: int, n: int, changed_only: bool = True):
    lengths = None if var.name == "length_5" else [5]
    try:
        return tracr_pairs(name, var.name, n=n, seed=seed, lengths=lengths, every_position=True,
                           changed_only=changed_only), True
    except ValueError:  # the whole value never differs between inputs as long (indices, length)
        return tracr_pairs(name, var.name, n=n, seed=seed, lengths=lengths, changed_only=changed_only), False


def row(name: str, var, loss: str, extra: dict, start_from: str = "random", all_reads: bool = False) -> str:
    model = ri.load_toy_model(name)
    basis = var.basis(model.cfg.d_model)
    check, every = pairs_for(name, var, seed=1, n=40)
    at = interchange(model, check, var.site, basis, progress=False)
    before = "-" if var.before is None else f"{interchange(model, check, var.before, basis, progress=False).accuracy:.2f}"
    pairs, _ = pairs_for(name, var, seed=0, n=100, changed_only=not all_reads)
    train, test = pairs.split(0.25)
    start = time.perf_counter()
    ident = var.identified(model, train)  # what the training pairs move of the variable: DAS is asked for that
    rank = ident.shape[1]
    options = DASOptions(rank=rank, **{"epochs": 20, "lr": 0.02, "loss": loss, **extra})
    if start_from == "mean_difference":
        fit, init_k = mean_difference_fit(name, model, var, train, test, options, ident)
    else:
        fit, init_k = das(model, train, var.site, options, test=test, progress=False), ""
    pk = float(var.kernel(fit.basis, of=ident).score) / rank
    whole = float((ident.T @ fit.basis.double()).square().sum()) / rank  # no unread part dropped
    controls = " / ".join(f"{c.accuracy:.2f}" for c in fit.controls.values())
    return (f"| {name.removeprefix('tracr-')} | `{var.name}` | {var.writer} | `{var.site.hook}` | {len(var.dims)} | {var.rank} "
            f"| {'every' if every else 'one'} | {rank} | {at.accuracy:.2f} | {before} | {at.null_accuracy:.2f} "
            f"| {init_k}{fit.accuracy:.2f} | {pk:.2f} (whole {whole:.2f}) | {controls} |  <!-- {time.perf_counter() - start:.0f} s -->")


def mean_difference_start(model, pairs, site, values, rank: int) -> torch.Tensor:
    """The span of the class means of the source activations at the intervened positions, grouped by
    ``values(row, position)``, centred; its ``rank`` leading directions, completed at random (seed 0) where
    there are fewer classes."""
    acts, classes = [], []
    for rows in chunks(pairs, 64):
        a = record(model, site, *inputs(pairs, rows, "source"))
        for i, r in enumerate(rows.tolist()):
            x, q = pairs.keys[r]
            for p in (range(1, len(x) + 1) if q is None else [q + 1]):
                if values(r, p) is not None:
                    acts.append(a[i] if a.ndim == 2 else a[i, p])
                    classes.append(values(r, p))
    acts = torch.stack(acts).double()
    means = torch.stack([acts[torch.tensor([c == k for c in classes])].mean(0) for k in dict.fromkeys(classes)])
    basis = orthonormal_basis((means - means.mean(0)).T)[:, :rank].float()
    if basis.shape[1] < rank:
        extra = torch.randn(basis.shape[0], rank - basis.shape[1], generator=torch.Generator().manual_seed(0))
        basis = torch.linalg.qr(torch.cat([basis, extra - basis @ (basis.T @ extra)], 1))[0]
    return basis


def mean_difference_fit(name, model, var, train, test, options, ident):
    """DAS from the class-mean start, and each control trained from its own start of the same kind (its own
    model's activations; the arbitrary labels' classes): DAS's fit with those controls, and the starts'
    kernels / rank ("model / arbitrary / untrained") and the model start's held-out accuracy."""
    run = tracr_causal_model(name).run
    value = lambda P: lambda r, p: run(P.keys[r][0])[var.name][p - 1]  # noqa: E731
    arbitrary = train.with_labels(arbitrary_labels(train, seed=options.seed))
    held = test.with_labels(arbitrary_labels(test, seed=options.seed))
    untrained = untrained_copy(model, seed=options.seed)
    runs = {"model": (model, train, test, value(train)),
            "arbitrary labels": (model, arbitrary, held, lambda r, p: int(arbitrary.labels[r])),
            "untrained model": (untrained, train, test, value(train))}
    fits, kernels = {}, []
    for what, (m, P, T, values) in runs.items():
        start = mean_difference_start(m, P, var.site, values, options.rank)
        kernels.append(float(var.kernel(start, of=ident).score) / options.rank)
        if what == "model":
            first = interchange(m, T, var.site, start, progress=False).accuracy
            plain = float((ident.T @ start.double()).square().sum()) / options.rank  # no unread part dropped
        fits[what] = das(m, P, var.site, options, test=T, controls=(), init=start, progress=False)
    fit = fits.pop("model")
    fit = replace(fit, controls={k: f.fit for k, f in fits.items()})
    return fit, (f"{' / '.join(f'{k:.2f}' for k in kernels)} (the model's start: accuracy {first:.2f}, "
                 f"whole kernel {plain:.2f}) -> ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="squared", choices=("squared", "cross_entropy"))
    ap.add_argument("--tempered", action="store_true", help="DAS with the options TEMPERED")
    ap.add_argument("--start", default="random", choices=("random", "mean_difference"),
                    help="DAS's start: drawn from the seed, or the class means' span (MEAN_DIFFERENCE's options)")
    ap.add_argument("--only", nargs="+", default=list(TRACR_PROGRAMS))
    ap.add_argument("--all-reads", action="store_true",
                    help="DAS trained and scored on every read, the unchanged ones too (a side effect costs)")
    ap.add_argument("--variables", nargs="+", default=None, help="only these variables (by name)")
    args = ap.parse_args()
    start = "start kernel / rank (model / arbitrary / untrained) -> " if args.start != "random" else ""
    print("| program | variable | writer | site | dims | rank | positions | identified | interchange | before | null "
          f"| {start}DAS | DAS kernel / identified | controls (arbitrary / untrained) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    extra = TEMPERED if args.tempered else MEAN_DIFFERENCE if args.start != "random" else {}
    for name in args.only:
        for var in tracr_variables(name).values():
            if var.rank and (args.variables is None or var.name in args.variables):
                print(row(name, var, args.loss, extra, args.start, args.all_reads), flush=True)


if __name__ == "__main__":
    main()
