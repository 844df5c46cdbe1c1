#!/usr/bin/env bash
# Build the documentation site from the sources: MkDocs + Material + mkdocstrings (pinned in
# pyproject.toml's `docs` extra), offline, warnings as errors (`mkdocs build --strict`).
#
#   bash scripts/build_docs.sh                       # -> build/site/ (open build/site/index.html)
#   bash scripts/build_docs.sh --site-dir DIR        # options pass through to `mkdocs build`
#   bash scripts/build_docs.sh --execute-notebooks [NAME ...] [-- MKDOCS OPTIONS]
#                                                    # run the notebooks, store their outputs, then build
#
# What fails the build: a broken link or cross-reference, a public name of rs_interp.__all__ missing
# from the reference or without a docstring with an example, an example that fails (the pages'
# executed examples and the docstrings' examples: RS_INTERP_DOCS_DOCTEST=all|attributes|none),
# notebook outputs stored for other code than the notebook's (docs/_hooks/).
# Which Python: $PYTHON if set; else the active venv ($VIRTUAL_ENV) when it has the docs packages
# (pip install '.[docs]' or -e '.[docs]'); else the project's venv of RS_INTERP_TL (default 4;
# scripts/_env.sh), set up first if it lacks them. It says which. tests/integration/test_docs.py runs it in one
# pass of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
has_docs() { "$1" -c "import mkdocs, material, mkdocstrings_handlers.python, rs_interp" 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
  has_docs "$PY" || { echo "build_docs: $PY lacks the docs packages or rs_interp (pip install '.[docs]')" >&2; exit 1; }
  why="PYTHON"
elif [ -n "${VIRTUAL_ENV:-}" ] && has_docs "$VIRTUAL_ENV/bin/python"; then
  PY="$VIRTUAL_ENV/bin/python"; why="the active venv"
else
  PY="$VENV/bin/python"; why="the project's venv $VENV"
  if ! has_docs "$PY"; then
    echo "build_docs: setting up $VENV with the docs packages (no active venv has them)" >&2
    bash scripts/setup_env.sh >&2
  fi
fi
echo "build_docs: building with $PY ($why)" >&2
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" NO_MKDOCS_2_WARNING=1
if [ "${1:-}" = "--execute-notebooks" ]; then
  shift
  names=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do names+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  "$PY" docs/_hooks/notebooks.py "${names[@]}"
fi
"$PY" -m mkdocs build --strict "$@"
