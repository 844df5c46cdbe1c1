#!/usr/bin/env bash
# The whole test suite, the slow reproductions included (a bare `pytest` skips those).
# Options pass through to pytest; a later -m wins, e.g. bash scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_browser.sh
exec "${RS_INTERP_VENV:-.venv}/bin/python" -m pytest -m "slow or not slow" "$@"
