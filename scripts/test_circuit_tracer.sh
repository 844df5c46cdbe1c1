#!/usr/bin/env bash
# The optional circuit-tracer job (issue 53): an attribution graph computed by circuit-tracer itself (its
# attribute, prune_graph, compute_graph_scores, create_graph_files) against rs_interp's with
# convention="circuit-tracer", on a random model and random transcoder files written here in its format.
# A sibling of scripts/test_references.sh: circuit-tracer pins transformers<=4.57.3 and nnsight, which
# share neither rs_interp's venvs nor the MIB reference venv. CI does not run it (tests marked `reference`).
#
#   RS_CT_SRC=/path/to/circuit-tracer bash scripts/test_circuit_tracer.sh [pytest options]
#
# RS_CT_SRC is a checkout of decoderesearch/circuit-tracer (checked at 4bb8c0e, version 0.4.1).
# RS_CT_VENV (default .venv-ct) is made once: torch==2.13.0 first (the build rs_interp's venvs use), then
# circuit-tracer from RS_CT_SRC with its own pins (TransformerLens 2.x, transformers 4.57). Nothing is
# downloaded from a model hub: the script builds its tokenizer from the test's vocabulary.
# The tests run in rs_interp's 4.x venv (scripts/_env.sh), calling the venv's python on
# scripts/reference_circuit_tracer.py.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RS_CT_SRC:?set RS_CT_SRC to a checkout of decoderesearch/circuit-tracer}"
CT_VENV="${RS_CT_VENV:-$PWD/.venv-ct}"
source scripts/_ref_venv.sh
ref_venv "$CT_VENV" circuit_tracer "$RS_CT_SRC"
VENV=$(RS_INTERP_TL=4; source scripts/_env.sh; echo "$VENV")
RS_CT_PYTHON="$CT_VENV/bin/python" OMP_NUM_THREADS=1 \
  "$VENV/bin/python" -m pytest tests/integration/test_references_circuit_tracer.py -m reference -p no:cacheprovider -s "$@"
