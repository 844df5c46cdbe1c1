#!/usr/bin/env bash
# The main job: reproduce every table of the theory offline and write results.json + report.html.
# Usage: bash scripts/reproduce.sh [--out DIR] [--retrain] [--seed N]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${RS_INTERP_VENV:-.venv}/bin/rs-interp" reproduce "$@"
