"""The main job (``rs-interp reproduce``, what ``bash scripts/reproduce.sh`` runs) against its budget:
the whole job in a fresh process, from start to the written report, within 2 minutes on 2 cores.

It runs the command line as a user does (``python -m rs_interp.ui.cli reproduce --out DIR --quiet`` plus
any ``--jobs``), reads each section's CPU and wall seconds from ``DIR/results.json`` (``"cost"``,
written by the job itself) and prints them with the process's total CPU seconds (its workers
included) and the elapsed wall time. It exits with status 1 when the elapsed time is past
``--budget`` (120 s) or a row is outside its band: a benchmark, not a test (on a shared machine it
measures the machine; the load average is printed first, and the docs give a quiet machine's figure).

Usage: python benchmarks/bench_main_job.py [--budget 120] [--jobs N] [--out DIR] [--only SECTION ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="seconds the whole job may take (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=None, help="the job's --jobs (default: the job's own default)")
    parser.add_argument("--out", default=None, help="where the job writes (default: a temporary directory)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these sections (then the budget is not judged)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_main_job_"))
    cmd = [sys.executable, "-m", "rs_interp.ui.cli", "reproduce", "--out", str(out), "--quiet"]
    if args.jobs is not None:
        cmd += ["--jobs", str(args.jobs)]
    if args.only:
        cmd += ["--only", *args.only]
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} on {os.cpu_count()} cores")
    print(" ".join(cmd))
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        print(f"the job failed (exit code {done.returncode})")
        return 1
    data = json.loads((out / "results.json").read_text())
    cost = data["cost"]
    print(f"\n{'section':22s} {'CPU s':>8s} {'wall s':>8s}")
    for name, c in cost.items():
        if name != "total":
            print(f"{name:22s} {c['cpu_seconds']:8.1f} {c['wall_seconds']:8.1f}")
    total = cost["total"]
    print(f"{'sum of sections':22s} {total['cpu_seconds']:8.1f} {total['wall_seconds']:8.1f}")
    print(f"\nthe job: {elapsed:.1f} s elapsed (process start to report written), {children.ru_utime + children.ru_stime:.1f} CPU s "
          f"(every process and thread), peak RSS of the largest process {children.ru_maxrss / 1e6:.2f} GB")
    outside = [(k, r["measure"]) for k, rows in data["bands"].items() for r in rows if r["ok"] is False]
    print(f"rows outside their band: {len(outside)}" + "".join(f"\n  {k}: {m}" for k, m in outside))
    if outside:
        return 1
    if args.only:
        print("(--only: a part of the job, not judged against the budget)")
        return 0
    verdict = "within" if elapsed <= args.budget else "PAST"
    print(f"{verdict} the budget of {args.budget:.0f} s")
    return 0 if elapsed <= args.budget else 1


if __name__ == "__main__":
    sys.exit(main())
