"""The methods registry's estimates on a GPT-2-small-shaped model (random weights), each as the registry runs it
(``METHODS[name].run``, the entry's own options), beside the exact resample scan they approximate: node attribution
patching (every head), edge attribution patching (every edge of the graph: embed, heads and MLPs into q/k/v inputs,
MLPs and logits), EAP-IG, the QK fix, the Hessian correction, RelP ... Every entry that is one helper's call and
estimates (not ``exact``) is timed, a method added to the registry included; ``--methods`` picks entries by key
(``EAP AtP scan``, or an exact one: path patching is one pass per edge, 32,491 on GPT-2 small). Each in its own
subprocess.

Usage: python benchmarks/bench_attribution_patching.py [--batch 1] [--pos 64] [--methods KEY ...] [--list]
"""

from __future__ import annotations

import argparse

from _child import GPT2_SETUP as _SETUP
from _child import run_child

_BODY = r"""
from rs_interp.circuits.methods import METHODS
method = next(m for m in METHODS.values() if m.key == tool)
values = method.run(model, tokens, metric, reference=reference, progress=False).effect
out = {"shape": list(values.shape)}
"""


def timed_methods(keys: list[str] | None = None) -> dict[str, str]:
    """key -> name of the registry's entries to time: ``keys`` (any entry), or by default every estimate that is
    one helper's call, then the exact resample scan (``scan``)."""
    from rs_interp.circuits.methods import METHODS

    by_key = {m.key: m.name for m in METHODS.values()}
    if keys:
        unknown = [k for k in keys if k not in by_key]
        if unknown:
            raise SystemExit(f"no registry method has the key {', '.join(unknown)}; the keys: {', '.join(by_key)}")
        return {k: by_key[k] for k in keys}
    chosen = {m.key: m.name for m in METHODS.values() if m.helper is not None and not m.exact}
    return chosen | {"scan": by_key["scan"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("--methods", nargs="+", metavar="KEY", help="registry keys (default: every estimate, then scan)")
    ap.add_argument("--list", action="store_true", help="list what would be timed and stop")
    args = ap.parse_args()
    methods = timed_methods(args.methods)
    if args.list:
        print("\n".join(f"{k}: {n}" for k, n in methods.items()))
        return
    print(f"{'method (registry key: name)':<60}  {'seconds':>8}  {'peak extra':>10}")
    for key, name in methods.items():
        r = run_child(_SETUP, _BODY, key, args.batch, args.pos)
        print(f"{key + ': ' + name:<60}  {r['seconds']:8.2f}  {r['peak_extra_bytes'] / 2**30:8.2f} GB")


if __name__ == "__main__":
    main()
