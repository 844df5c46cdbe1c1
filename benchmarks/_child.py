"""What the side-by-side benchmarks share: each tool runs in its own subprocess (its own peak RSS),
with this prelude (imports, ``rss_now``, ``base``) before its body and this epilogue after it; the body
sets ``out`` (a dict) and the epilogue adds the time and the peak memory above ``base``."""

from __future__ import annotations

import json
import subprocess
import sys
import time

PRELUDE = r"""
import json, resource, sys, time, warnings, torch
warnings.filterwarnings("ignore")
import rs_interp as ri
torch.set_grad_enabled(False)
def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
"""

#: GPT-2 small (random weights), ``tokens`` and ``reference`` of ``sys.argv[2] x sys.argv[3]`` and a
#: metric that reads the last position; ``tool`` is ``sys.argv[1]``.
GPT2_SETUP = r"""
tool, batch, pos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = ri.load_gpt2("random")
g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
reference = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)
metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 42].mean()  # reads the last position only
"""

#: Resets the peak (ru_maxrss, by writing "5" to /proc/self/clear_refs) after the setup, so the peak
#: measured is the tool's, not the model load's (a checkpoint's copies); ``base`` is the RSS then.
#: GPT-2 small (random weights) with random TopK transcoders: ``model``, ``tcs`` (one per layer, ``width``
#: features, ``k`` active, no gradients) and ``tokens`` of ``pos`` ids, from the generator ``g``.
GPT2_RANDOM_TRANSCODERS = r"""
model = ri.load_gpt2("random")
d = model.cfg.d_model
layers = []
for _ in range(model.cfg.n_layers):
    tc = Transcoder(d, width, activation="topk", k=k)
    with torch.no_grad():
        tc.W_enc.normal_(0, d ** -0.5, generator=g)
        tc.W_dec.normal_(0, width ** -0.5, generator=g)
        tc.b_dec.normal_(0, 0.02, generator=g)
    layers.append(tc.requires_grad_(False))
tcs = TranscoderSet(tuple(layers), scan="random")
tokens = torch.randint(0, model.cfg.d_vocab, (pos,), generator=g)
"""

START = r"""
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
base = rss_now()
t = time.perf_counter()
"""

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


def best_of(fn, repeats: int):
    """The least wall seconds of ``repeats`` calls of ``fn`` (in this process) and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out
