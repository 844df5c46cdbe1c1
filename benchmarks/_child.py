"""What the side-by-side benchmarks share: each tool runs in its own subprocess (its own peak RSS),
with this prelude (imports, ``rss_now``, ``base``) before its body and this epilogue after it; the body
sets ``out`` (a dict) and the epilogue adds the time and the peak memory above ``base``."""

from __future__ import annotations

import json
import subprocess
import sys

PRELUDE = r"""
import json, resource, sys, time, warnings, torch
warnings.filterwarnings("ignore")
import rs_interp as ri
torch.set_grad_enabled(False)
def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
"""

START = "base = rss_now()\nt = time.perf_counter()\n"

EPILOGUE = r"""
out["seconds"] = time.perf_counter() - t
out["peak_extra_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps(out))
"""


def run_child(setup: str, body: str, *args: object) -> dict:
    """Run ``PRELUDE + setup``, then time ``body`` (which sets ``out``); return ``out`` with seconds and memory."""
    code = PRELUDE + setup + START + body + EPILOGUE
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
