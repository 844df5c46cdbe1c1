#!/usr/bin/env bash
# The main job: reproduce every table of the theory offline and write results.json + report.html.
# Usage: bash scripts/reproduce.sh [--out DIR] [--retrain] [--seed N] [--seeds N] [--only ...]
# RS_INTERP_TL=3 runs it on TransformerLens 3.x (HookedTransformer); the default is 4.x.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
bash scripts/setup_env.sh
exec "$VENV/bin/rs-interp" reproduce "$@"
