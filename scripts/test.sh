#!/usr/bin/env bash
# The test suite, the slow reproductions included. Pass pytest options through, e.g. -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_browser.sh
exec "${RS_INTERP_VENV:-.venv}/bin/python" -m pytest "$@"
