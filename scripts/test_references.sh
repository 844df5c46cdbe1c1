#!/usr/bin/env bash
# The optional reference job (issue 53): rs_interp's MIB files and circuits through the reference code
# itself, MIB's circuit-track harness and EAP-IG, in a venv of their own (their pins, TransformerLens
# 2.x, cannot share rs_interp's venvs). CI does not run it (scripts/test.sh leaves out the tests
# marked `reference`). circuit-tracer has a sibling job of its own: scripts/test_circuit_tracer.sh.
#
#   RS_REF_SRC=/path/to/sources bash scripts/test_references.sh [pytest options]
#
# RS_REF_SRC holds the two reference checkouts: EAP-IG/ (hannamw/EAP-IG at 7af394a, the commit
# MIB-circuit-track pins as its submodule) and MIB-circuit-track/ (hannamw/MIB-circuit-track).
# RS_REF_VENV (default .venv-ref) is made once: torch==2.13.0 first (the build rs_interp's venvs use),
# then TransformerLens 2.16.1, numpy 2 (pyarrow needs it), matplotlib and tabulate (EAP-IG's and MIB's
# dependencies). The reference code is copied into $RS_REF_VENV/ref with one change: EAP-IG's
# hard-coded device='cuda' becomes model.cfg.device (this machine has no GPU).
# The tests themselves run in rs_interp's 4.x venv (scripts/_env.sh), calling the reference venv's
# python on scripts/reference_mib.py.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RS_REF_SRC:?set RS_REF_SRC to the folder holding EAP-IG/ and MIB-circuit-track/}"
REF_VENV="${RS_REF_VENV:-$PWD/.venv-ref}"
source scripts/_ref_venv.sh
# numpy 2 last: pyarrow (through datasets) needs it
ref_venv "$REF_VENV" transformer_lens "transformer-lens==2.16.1 matplotlib tabulate" "numpy>=2,<2.3"
rm -rf "$REF_VENV/ref" && mkdir -p "$REF_VENV/ref"
cp -r "$RS_REF_SRC/EAP-IG/src/eap" "$REF_VENV/ref/eap"
cp -r "$RS_REF_SRC/MIB-circuit-track/MIB_circuit_track" "$REF_VENV/ref/MIB_circuit_track"
sed -i "s/device='cuda'/device=model.cfg.device/g" "$REF_VENV"/ref/eap/*.py
VENV=$(RS_INTERP_TL=4; source scripts/_env.sh; echo "$VENV")
RS_REF_PYTHON="$REF_VENV/bin/python" RS_REF_PATH="$REF_VENV/ref" OMP_NUM_THREADS=1 \
  "$VENV/bin/python" -m pytest tests/integration/test_references.py -m reference -p no:cacheprovider -s "$@"
