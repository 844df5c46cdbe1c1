"""How long the package and the command line take to start, beside what they would cost if they
loaded torch and TransformerLens up front, measured in the same run (fresh interpreters, median of
``--repeat``).

Goal: ``import rs_interp`` and ``rs-interp COMMAND --help`` (or an argument error) within a few
tenths of a second and a small fraction of ``import transformer_lens``; public names are imported
on first use (rs_interp._lazy). The ratio column is each row's time over a bare interpreter's.

Usage: python benchmarks/bench_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ROWS = {
    "python -c pass (bare interpreter)": "pass",
    "import rs_interp": "import rs_interp",
    "rs-interp --help": "from rs_interp.ui.cli import main; main(['--help'])",
    "rs-interp circuit --help": "from rs_interp.ui.cli import main; main(['circuit', '--help'])",
    "rs-interp reproduce --only nosuch (argument error)": "from rs_interp.ui.cli import main; main(['reproduce', '--only', 'nosuch'])",
    "import torch": "import torch",
    "import transformer_lens": "import transformer_lens",
    "rs_interp.load_toy_model(\"induction-1l\") (first use)": "import rs_interp; rs_interp.load_toy_model('induction-1l')",
}


def timed(code: str) -> float:
    """Wall time of a fresh interpreter running ``code`` (a SystemExit from --help counts as done)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"try:\n    {code}\nexcept SystemExit:\n    pass"], capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    times = {name: statistics.median(timed(code) for _ in range(args.repeat)) for name, code in ROWS.items()}
    bare = times["python -c pass (bare interpreter)"]
    width = max(map(len, times))
    print(f"{'start-up':<{width}}  {'median s':>9}  {'x bare':>7}")
    for name, t in times.items():
        print(f"{name:<{width}}  {t:>9.3f}  {t / bare:>7.1f}")


if __name__ == "__main__":
    main()
