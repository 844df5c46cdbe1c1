#!/usr/bin/env bash
# Create (or reuse) the venv for one TransformerLens major version and install rs_interp with its
# test extras: RS_INTERP_TL=3 or 4 (default 4), in .venv-tl3 / .venv-tl4 (see scripts/_env.sh).
# torch==2.13.0 goes first: that CPU build lies on disk here, and a plain `torch` requirement
# would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
# --no-compile: pip byte-compiles every file it installs (torch alone: 37 s of a core, 11 s without);
# Python compiles the modules actually imported on their first import, a few seconds, once (unless
# PYTHONDONTWRITEBYTECODE is set: scripts/test.sh unsets it).
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/python" -m pip install -q --no-compile "torch==2.13.0"
# The dependencies (read from pyproject.toml: the runtime ones and the `test` and `docs` extras, the
# latter for scripts/build_docs.sh; RS_INTERP_SKIP_DOCS=1 leaves `docs` out, as scripts/test.sh does),
# then rs_interp itself without them. Two set-ups may run
# side by side (scripts/test.sh): the dependencies install apart, but both editable installs build in
# this folder (rs_interp.egg-info), so that short step takes a lock.
# RS_INTERP_DOCS_ONLY=1 installs the `docs` extra alone into a venv set up before (scripts/test.sh does
# that in the background while the 3.x pass runs: the docs tests come last in it).
if [ "${RS_INTERP_DOCS_ONLY:-}" = "1" ]; then
  mapfile -t deps < <("$VENV/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
  "$VENV/bin/python" -m pip install -q --no-compile "${deps[@]}"
  echo "setup_env: $VENV has the docs packages" >&2
  exit 0
fi
deps=$("$VENV/bin/python" -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; x = p["optional-dependencies"]; import os; docs = [] if os.environ.get("RS_INTERP_SKIP_DOCS") == "1" else x["docs"]; print("\n".join(p["dependencies"] + x["test"] + docs))')
mapfile -t deps <<< "$deps"
"$VENV/bin/python" -m pip install -q --no-compile "${deps[@]}" "$TL_REQUIREMENT"
flock .setup_env.lock "$VENV/bin/python" -m pip install -q --no-deps -e .
echo "setup_env: $VENV has $("$VENV/bin/python" -c 'import importlib.metadata as m; print("transformer-lens", m.version("transformer-lens"))')" >&2
