#!/usr/bin/env bash
# The whole test suite, the slow reproductions included (a bare `pytest` skips those), under both
# TransformerLens major versions, each in its own venv: 3.x (HookedTransformer), then 4.x
# (TransformerBridge). RS_INTERP_TL=3 or 4 runs one of them only.
# Options pass through to pytest; a later -m wins, e.g. bash scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_browser.sh
if [ -n "${RS_INTERP_TL:-}" ]; then versions="$RS_INTERP_TL"; else versions="3 4"; fi
# Where each version's run records its numbers; the second run compares (tests/test_cross_version.py).
export RS_INTERP_CROSS_DIR="${RS_INTERP_CROSS_DIR:-$(mktemp -d -t rs_interp_cross.XXXXXX)}"
for v in $versions; do
  (
    export RS_INTERP_TL="$v"
    source scripts/_env.sh
    bash scripts/setup_env.sh
    echo "== the suite under TransformerLens $RS_INTERP_TL ($VENV)" >&2
    start=$(date +%s)
    "$VENV/bin/python" -m pytest -m "slow or not slow" "$@"
    echo "== TransformerLens $RS_INTERP_TL: $(( $(date +%s) - start )) s" >&2
  )
done
