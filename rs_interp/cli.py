"""The ``rs-interp`` command line: ``reproduce`` (the main job), ``gpt2``, ``train``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _log(msg: str) -> None:
    print(f"[rs-interp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _reproduce(args: argparse.Namespace) -> int:
    from .report import format_table, run_sections, write_report, write_results
    from .sections import Context

    ctx = Context(retrain=args.retrain, seed=args.seed, progress=not args.quiet, log=_log)
    sections = run_sections(ctx, args.only)
    for s in sections:
        print(format_table(s) + "\n", flush=True)
    out = Path(args.out)
    write_results(sections, out / "results.json")
    write_report(sections, out / "report.html")
    n_out = sum(r.ok is False for s in sections for r in s.rows)
    print(f"wrote {out / 'results.json'} and {out / 'report.html'}; {n_out} row(s) outside their band")
    return 0


def _train(args: argparse.Namespace) -> int:
    from .models import save_model
    from .training import TOY_TRAINING, evaluate, test_batch, train_induction_model

    settings = dict(TOY_TRAINING[args.name], seed=args.seed)
    model = train_induction_model(**settings, progress=not args.quiet)
    score = evaluate(model, test_batch())
    path = save_model(model, Path(args.out) / args.name, metadata={"training": settings, "test_loss": score.loss, "test_accuracy": score.accuracy})
    print(f"{args.name}: loss {score.loss:.4f}, accuracy {score.accuracy:.4f}; saved to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rs-interp", description="Residual-stream interpretability on TransformerLens: reproduce the theory's tables, run the GPT-2 analyses, train the toy models.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    r = sub.add_parser("reproduce", help="reproduce every table of the theory offline; write results.json and report.html",
                       description="Reproduce every table of the theory offline, print each beside the theory's values, and write DIR/results.json and DIR/report.html.")
    r.add_argument("--out", default="rs_interp_out", metavar="DIR", help="output directory (default: %(default)s)")
    r.add_argument("--retrain", action="store_true", help="retrain the toy models instead of loading the shipped ones (~1 minute)")
    r.add_argument("--seed", type=int, default=0, help="training seed with --retrain (default: %(default)s, the shipped models' seed)")
    r.add_argument("--only", nargs="+", metavar="SECTION", help="compute only these sections")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(func=_reproduce)
    t = sub.add_parser("train", help="train a toy induction model and save it", description="Train a toy induction model with the recorded settings and save it as safetensors + JSON.")
    t.add_argument("name", choices=["induction-2l", "induction-1l"])
    t.add_argument("--seed", type=int, default=0, help="training seed (default: %(default)s)")
    t.add_argument("--out", default="rs_interp_out", metavar="DIR", help="output directory (default: %(default)s)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=_train)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as err:
        print(f"rs-interp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
