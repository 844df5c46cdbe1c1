#!/usr/bin/env bash
# The whole test suite (what CI runs), under both TransformerLens major versions, each in its own venv.
#
# What runs where (the cross-version promise is checked on every run):
#   4.x (TransformerBridge, the default version): everything but the `docs` tests, the slow
#       reproductions included (retraining, seeds, the report in Chromium, the notebooks), once.
#   3.x (HookedTransformer): the fast suite, tests/integration/test_cross_version.py, the slow tests marked
#       `tl3` (they balance the two passes: code-2l's loss curve over its first 300 steps, ...),
#       and the tests marked `docs`: the documentation site's build (scripts/build_docs.sh, --strict)
#       and its browser test.
#   Neither: tests marked `reference` (rs_interp's files through MIB's and EAP-IG's own code, in a venv of
#       their own: bash scripts/test_references.sh; circuit-tracer's: bash scripts/test_circuit_tracer.sh), and tests marked `full` (code-2l's phase change, 2,500 steps, ~12 minutes, and its full
#       4,000-step retraining, ~18 minutes): `pytest -m full`.
#       3.x-only paths (shortformer and alibi variants) are fast tests: they run here.
# The two passes run side by side, one thread each (2 cores), the 3.x pass's output goes to a log
# printed when both are done (meanwhile a line on stderr each minute says how far it is: scripts/_progress.sh),
# then one closing line for both.
# ruff (lint and import order) runs first, once.
# The cross-version records (tests marked cross_version, run first by tests/conftest.py): the 3.x pass
# records, the 4.x pass waits for the records and compares.
#
# RS_INTERP_TL=3 or 4 runs one version only (everything it can run but the `full` tests).
# Options pass through to pytest; a later -m wins, e.g. bash scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
# The venvs install without byte-compiling (scripts/setup_env.sh): the first import of a module writes
# its cache, which a PYTHONDONTWRITEBYTECODE environment would forbid (every import, in every test's
# subprocess, would compile again: `import torch` 6.4 s instead of 3.7 s).
unset PYTHONDONTWRITEBYTECODE
source scripts/_progress.sh
bash scripts/setup_browser.sh
if [ -n "${RS_INTERP_TL:-}" ]; then versions="$RS_INTERP_TL"; else versions="3 4"; fi
export RS_INTERP_CROSS_DIR="${RS_INTERP_CROSS_DIR:-$(mktemp -d -t rs_interp_cross.XXXXXX)}"
logs=$(mktemp -d -t rs_interp_test.XXXXXX)
start=$(date +%s)

venv_of() { (RS_INTERP_TL=$1; source scripts/_env.sh; echo "$VENV"); }
# One pass: version $1, marker expression $2, then the user's options. Each pass has its own temporary
# folder (pytest's default one is shared, and each session prunes the older sessions' folders).
# One intra-op thread per pass: two passes side by side on 2 cores with torch's default (one thread per
# core) oversubscribe the cores, and OpenMP's spinning barriers then make small models' forward passes
# up to ~15x slower (the finance notebook took 800 s beside the 3.x pass, 55 s alone).
pass() {
  local v=$1 marks=$2; shift 2
  local venv; venv=$(venv_of "$v")
  local t0; t0=$(date +%s)
  local rc=0
  RS_INTERP_TL=$v "$venv/bin/python" -m pytest \
    -m "$marks" --durations=30 --junitxml="$logs/tl$v.xml" --basetemp="$logs/tmp$v" "$@" || rc=$?
  echo "== TransformerLens $v: $(( $(date +%s) - t0 )) s (exit $rc)"
  return $rc
}

# Lint and import order (ruff, pinned in the test extra; pyproject.toml's [tool.ruff]) before any test:
# a failure stops the run, naming the file and line.
lint() {
  "$(venv_of "$1")/bin/python" -m ruff check . || { echo "== ruff: fix the lines above (ruff check --fix . fixes the import order)" >&2; return 1; }
  echo "== ruff: clean" >&2
}

rc=0
if [ "$versions" = "3 4" ]; then
  # Both venvs are set up side by side (scripts/setup_env.sh locks the one step they share, the
  # editable install in this folder); the 3.x pass, which holds the longest test (code-2l's
  # retraining), starts as soon as its venv is ready, the 4.x pass when its own is.
  # The 4.x pass does not build the docs (the 3.x pass does): its venv skips the docs packages.
  RS_INTERP_TL=4 RS_INTERP_SKIP_DOCS=1 bash scripts/setup_env.sh > "$logs/setup4.log" 2>&1 &
  setup4=$!
  # The docs packages install into the 3.x venv in the background once its pass has started (they
  # take ~50 s; the docs tests, last in that pass, wait for $RS_INTERP_DOCS_SETUP.rc: tests/integration/test_docs.py).
  RS_INTERP_TL=3 RS_INTERP_SKIP_DOCS=1 bash scripts/setup_env.sh || { kill "$setup4"; exit 1; }
  echo "== set-up, 3.x: $(( $(date +%s) - start )) s" >&2
  lint 3 || { kill "$setup4"; exit 1; }
  export RS_INTERP_DOCS_SETUP="$logs/docs3"
  OMP_NUM_THREADS=1 pass 3 "(not slow or tl3 or docs) and not full and not reference" "$@" > "$logs/tl3.log" 2>&1 &
  pid3=$!
  pass_progress "$pid3" "$logs/tl3.log" 3.x &
  progress3=$!
  (sleep 30; rc=0; RS_INTERP_TL=3 RS_INTERP_DOCS_ONLY=1 bash scripts/setup_env.sh > "$RS_INTERP_DOCS_SETUP.log" 2>&1 || rc=$?
   echo $rc > "$RS_INTERP_DOCS_SETUP.rc") &
  wait "$setup4" || { cat "$logs/setup4.log" >&2; kill "$pid3"; exit 1; }
  cat "$logs/setup4.log" >&2
  echo "== set-up, 4.x: $(( $(date +%s) - start )) s" >&2
  # The 4.x pass's cross-version comparisons wait for the 3.x records (written at the 3.x pass's start).
  OMP_NUM_THREADS=1 RS_INTERP_CROSS_WAIT=900 pass 4 "(slow or not slow) and not full and not docs and not reference" "$@" || rc=$?
  wait $pid3 || rc=$?
  wait $progress3 || true
  echo "== the 3.x pass's output:"
  cat "$logs/tl3.log"
else
  RS_INTERP_TL=$versions bash scripts/setup_env.sh
  echo "== set-up: $(( $(date +%s) - start )) s" >&2
  lint "$versions"
  pass "$versions" "(slow or not slow) and not full and not reference" "$@" || rc=$?
fi
# One closing line for every pass, from the JUnit records.
python3 - "$logs" "$(( $(date +%s) - start ))" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
n = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for path in glob.glob(f"{sys.argv[1]}/*.xml"):
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for k in n:
            n[k] += int(suite.get(k, 0))
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print(f"== every pass, set-up included: {sys.argv[2]} s")
print(f"total: {passed} passed, {n['failures'] + n['errors']} failed, {n['skipped']} skipped")
PY
exit $rc
