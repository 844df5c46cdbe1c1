#!/usr/bin/env bash
# The main job: reproduce every table of the theory offline and write results.json + report.html.
# Usage: bash scripts/reproduce.sh [--out DIR] [--retrain] [--seed N] [--seeds N] [--only ...]
# RS_INTERP_TL=3 runs it on TransformerLens 3.x (HookedTransformer); the default is 4.x.
# Paths (--out, --cache) are where the caller stands, as for any command: the venv is set up in the clone,
# the job runs from the caller's directory.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
source scripts/_env.sh
bash scripts/setup_env.sh
venv=$(cd "$VENV" && pwd)
cd "$here"
exec "$venv/bin/rs-interp" reproduce "$@"
