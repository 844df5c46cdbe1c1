"""The ``rs-interp`` command line: ``reproduce`` (the main job), ``gpt2``, ``train``, ``circuit``."""

from __future__ import annotations

import argparse
import sys
import time

from ..models.registry import SHIPPED_MODELS
from ..reproduce import SECTIONS
from . import circuit_command
from ._args import count as _positive
from ._args import seed as _seed
from ._args import writable_dir as _writable_dir

__all__ = ["main"]


def _log(msg: str) -> None:
    print(f"[rs-interp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _reproduce(args: argparse.Namespace) -> int:
    from ..reproduce import run_seeds
    from ..reproduce.report import (
        describe_environment,
        format_cost,
        format_table,
        write_files,
        write_report,
        write_results,
    )

    out = _writable_dir(args.out)
    print(f"rs-interp reproduce on {describe_environment()}\n", flush=True)
    cache = None
    if args.cache:
        from ..models.registry import TrainingCache

        cache = TrainingCache(_writable_dir(args.cache))
    printed: set[str] = set()
    start = time.perf_counter()

    def finished(done) -> None:
        # each finished section: its table printed once, results.json and report.html rewritten with
        # everything so far (a stopped run keeps what it did)
        if args.seeds == 1:
            for s in done:
                if s.key not in printed:
                    printed.add(s.key)
                    print(format_table(s) + "\n", flush=True)
        write_results(done, out / "results.json", elapsed=time.perf_counter() - start)
        write_files(done, out)
        write_report(done, out / "report.html")

    sections = run_seeds(args.seed, args.seeds, args.only, retrain=args.retrain, progress=not args.quiet, log=_log,
                         cache=cache, on_section=finished, jobs=args.jobs)
    elapsed = time.perf_counter() - start
    for s in sections:
        if s.key not in printed:
            print(format_table(s) + "\n", flush=True)
    print(format_cost(sections, elapsed=elapsed) + "\n", flush=True)
    write_results(sections, out / "results.json", elapsed=elapsed)
    beside = write_files(sections, out)
    write_report(sections, out / "report.html", elapsed=elapsed)
    n_out = sum(r.ok is False for s in sections for r in s.rows)
    also = f" (beside it: {', '.join(p.name for p in beside)})" if beside else ""
    print(f"wrote {out / 'results.json'} and {out / 'report.html'}{also}; {n_out} row(s) outside their band")
    return 0


def _train(args: argparse.Namespace) -> int:
    from ..models.checkpoints import save_model
    from ..models.registry import train_shipped

    out = _writable_dir(args.out)
    trained = train_shipped(args.name, args.seed, progress=not args.quiet)
    path = save_model(trained.model, out / args.name, metadata=trained.metadata)
    if trained.tokenizer is not None:
        # read back by load_code_tokenizer(path)
        trained.tokenizer.save(str(path.with_name(path.name + ".tokenizer.json")))
    metrics = {k: v for k, v in trained.metadata.items() if isinstance(v, float)}
    print(f"{args.name}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())) + f"; saved to {path}")
    return 0


def _gpt2(args: argparse.Namespace) -> int:
    from ..models.gpt2 import find_pretrained_gpt2, load_gpt2
    from ..models.gpt2_sizes import count_parameters
    from ..reproduce.gpt2_check import analyse_gpt2

    out = _writable_dir(args.out) if args.out else None
    if args.weights == "random":
        model, source = load_gpt2("random", seed=args.seed), "random initialisation"
    elif args.weights:
        model, source = load_gpt2(args.weights), f"pretrained weights from {args.weights}"
    else:
        model, source = find_pretrained_gpt2()
        if model is None:
            raise RuntimeError(f"{source} Or run with --weights random for a structure-only run.")
    kind = "random" if args.weights == "random" else "pretrained"
    print(f"GPT-2 small, {kind} weights: {source}")
    pc = count_parameters(model)
    print(f"parameters: {pc.total:,} = " + " + ".join(f"{v:,} {k}" for k, v in pc.by_category.items()))
    a = analyse_gpt2(model, weights=kind, source=source, seed=args.seed)
    print("top previous-token heads:", ", ".join(a.top_prev_token))
    print("top induction heads:     ", ", ".join(a.top_induction))
    if a.prompt is not None:
        print(f"prompt {a.prompt!r}: top prediction {a.final_top_token!r}")
        print("logit lens, P(%r): " % a.prompt_answer
              + ", ".join(f"{l} {p:.3f}" for l, p in zip(a.lens_labels, a.lens_p_answer)))
    else:
        print("no tokenizer with these weights: the logit-lens prompt is skipped")
    if out is not None:
        import json

        payload = {"weights": kind, "source": source, "parameters": dict(pc.by_category, total=pc.total),
                   "top_prev_token": list(a.top_prev_token), "top_induction": list(a.top_induction),
                   "prev_token": a.prev_token.tolist(), "induction": a.induction.tolist(),
                   "lens_p_answer": dict(zip(a.lens_labels, a.lens_p_answer)), "final_top_token": a.final_top_token}
        (out / "gpt2.json").write_text(json.dumps(payload, indent=2))
        print(f"wrote {out / 'gpt2.json'}")
    return 0


def _default_jobs() -> int:
    import os

    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr, no usage dump, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rs-interp",
                description="Residual-stream interpretability on TransformerLens: reproduce the theory's tables, "
                            "run the GPT-2 analyses, train the toy models, find a task's circuit.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    r = sub.add_parser("reproduce",
                       help="reproduce every table of the theory offline; write results.json and report.html",
                       description="Reproduce every table of the theory offline, print each beside the theory's "
                                   "values, and write DIR/results.json and DIR/report.html.")
    r.add_argument("--out", default="rs_interp_out", metavar="DIR", help="output directory (default: %(default)s)")
    r.add_argument("--retrain", action="store_true",
                   help="retrain the toy models instead of loading the shipped ones (~1 minute)")
    r.add_argument("--seed", type=_seed, default=0,
                   help="seed of retraining (with --retrain), the collapse cloud, the gradient draws, the finance "
                        "corpus and model (default: %(default)s, the shipped models' seed)")
    r.add_argument("--seeds", type=_positive, default=1, metavar="N",
                   help="1 (default): the shipped models; N > 1: retrain every seeded piece for seeds SEED..SEED+N-1 "
                        "and report each banded row per seed and 'k of N within band'")
    r.add_argument("--only", nargs="+", metavar="SECTION", choices=list(SECTIONS),
                   help="compute only these sections: " + ", ".join(SECTIONS))
    r.add_argument("--cache", metavar="DIR",
                   help="keep every model trained in the run under DIR and read it back in later runs "
                        "instead of training again (keyed by recipe, seed, kernel path and versions)")
    r.add_argument("--jobs", type=_positive, default=_default_jobs(), metavar="N",
                   help="worker processes for the sections, one thread each, the longest section first "
                        "(default: %(default)s, the machine's cores up to 2; with --retrain or --seeds > 1: 1)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(func=_reproduce)
    g = sub.add_parser("gpt2", help="run the GPT-2 small analyses and say which weights were used",
                       description="Run the GPT-2 small analyses (parameter count, head roles, logit lens). Weights: "
                                   "--weights PATH (a local Hugging Face checkpoint directory), --weights random, or "
                                   "by default $RS_INTERP_GPT2_PATH or the Hugging Face cache.")
    g.add_argument("--weights", metavar="PATH", help="a local Hugging Face GPT-2 checkpoint directory, or 'random'")
    g.add_argument("--seed", type=_seed, default=0,
                   help="seed of the random tokens (and random weights) (default: %(default)s)")
    g.add_argument("--out", metavar="DIR", help="also write DIR/gpt2.json with the scores")
    g.set_defaults(func=_gpt2)
    trainable = [name for name, entry in SHIPPED_MODELS.items() if entry.trainer is not None]
    t = sub.add_parser("train", help="retrain a shipped model from its recipe and save it",
                       description="Retrain a shipped model with its recorded settings and save it as safetensors + "
                                   "JSON: " + "; ".join(f"{n}: {SHIPPED_MODELS[n].description}" for n in trainable)
                                   + ".")
    t.add_argument("name", choices=trainable)
    t.add_argument("--seed", type=_seed, default=None, help="training seed (default: the recorded one, 0)")
    t.add_argument("--out", default="rs_interp_out", metavar="DIR", help="output directory (default: %(default)s)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=_train)
    c = sub.add_parser("circuit", help="find a task's circuit: edge scores, faithfulness curve, diagram, one HTML page",
                       description="Score every edge on a task (EAP, EAP-IG or exact path patching), the faithfulness "
                                   "curve at MIB's ten sizes and the circuit at --size; write DIR/scores.safetensors, "
                                   "scores.json, importances_mib.json, curve.json, circuit.json, diagram.json, "
                                   "report.html, summary.json.")
    circuit_command.add_arguments(c)
    c.set_defaults(func=_circuit)
    return p


def _circuit(args: argparse.Namespace) -> int:
    for line in circuit_command.run_command(args):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RuntimeError, OSError) as err:
        # One line, no traceback: bad input, missing weights, unwritable output directory.
        print(f"rs-interp: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rs-interp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
