#!/usr/bin/env bash
# The optional reference job of issue 66: relevance patching through the RelP fork of TransformerLens
# (FarnoushRJ/RelP) and position-aware edges through PEAP's own code (technion-cs-nlp/PEAP), each in a venv of
# its own. CI does not run it (scripts/test.sh leaves out the tests marked `reference`).
#
#   RS_REF_SRC=/path/to/sources bash scripts/test_references_relp_peap.sh [pytest options]
#
# RS_REF_SRC holds the two checkouts: RelP/ (its TransformerLens/ folder is the fork) and PEAP/ (its src/).
# RS_RELP_VENV (default .venv-relp): torch==2.13.0 first (the build rs_interp's venvs use; the fork pins none),
# then transformers 4.41 (the fork's pin) and the fork itself. RS_PEAP_VENV (default .venv-peap): PEAP's pins
# (environment.yml: torch 2.7.0, TransformerLens 2.15.4, transformers 4.51.3, numpy 1.26.4, pandas 2.2.3,
# datasets 2.11.0), pyarrow below 15 (datasets 2.11 with numpy 1). Each is made once.
# The tests run in rs_interp's 4.x venv (scripts/_env.sh), calling scripts/reference_relp.py and
# scripts/reference_peap.py in those venvs.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RS_REF_SRC:?set RS_REF_SRC to the folder holding RelP/ and PEAP/}"
RELP_VENV="${RS_RELP_VENV:-$PWD/.venv-relp}"
PEAP_VENV="${RS_PEAP_VENV:-$PWD/.venv-peap}"
source scripts/_ref_venv.sh
ref_venv "$RELP_VENV" transformer_lens "transformers>=4.41,<4.42 $RS_REF_SRC/RelP/TransformerLens"
if ! { [ -x "$PEAP_VENV/bin/python" ] && "$PEAP_VENV/bin/python" -c "import transformer_lens, pandas" 2>/dev/null; }; then
  python3 -m venv "$PEAP_VENV"
  "$PEAP_VENV/bin/python" -m pip install -q --upgrade pip
  "$PEAP_VENV/bin/python" -m pip install -q --no-compile "torch==2.7.0"
  "$PEAP_VENV/bin/python" -m pip install -q --no-compile "transformer-lens==2.15.4" "transformers==4.51.3" "einops==0.6.1" \
    "numpy==1.26.4" "pandas==2.2.3" "tqdm==4.67.1" "datasets==2.11.0" "pyarrow<15"
fi
VENV=$(RS_INTERP_TL=4; source scripts/_env.sh; echo "$VENV")
RS_RELP_PYTHON="$RELP_VENV/bin/python" RS_PEAP_PYTHON="$PEAP_VENV/bin/python" RS_PEAP_SRC="$RS_REF_SRC/PEAP" OMP_NUM_THREADS=1 \
  "$VENV/bin/python" -m pytest tests/integration/test_references_relp_peap.py -m reference -p no:cacheprovider -s "$@"
