# Sourced by the scripts: which TransformerLens major version, and the venv that holds it.
# RS_INTERP_TL=3 (HookedTransformer) or 4 (TransformerBridge, the current release; the default).
# RS_INTERP_VENV overrides the venv path (default .venv-tl3 / .venv-tl4).
RS_INTERP_TL="${RS_INTERP_TL:-4}"
case "$RS_INTERP_TL" in
  3) TL_REQUIREMENT="transformer-lens>=3.9,<4" ;;
  4) TL_REQUIREMENT="transformer-lens>=4.3,<5" ;;
  *) echo "RS_INTERP_TL must be 3 or 4, got '$RS_INTERP_TL'" >&2; exit 2 ;;
esac
VENV="${RS_INTERP_VENV:-.venv-tl$RS_INTERP_TL}"
