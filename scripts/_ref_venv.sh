# Sourced by the reference scripts (test_references.sh, test_circuit_tracer.sh): one way to make a
# reference implementation's own venv. ref_venv DIR MODULE PACKAGE_SET... makes DIR once (when its python
# cannot import MODULE): pip upgraded, torch==2.13.0 first (the build rs_interp's venvs use), then each
# PACKAGE_SET in its own pip install (a later set may re-pin what an earlier one pulled in).
ref_venv() {
  local dir=$1 module=$2
  shift 2
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import $module" 2>/dev/null; then
    return 0
  fi
  python3 -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  "$dir/bin/python" -m pip install -q --no-compile "torch==2.13.0"
  local set
  for set in "$@"; do
    # shellcheck disable=SC2086  # a set is several requirements, split on spaces on purpose
    "$dir/bin/python" -m pip install -q --no-compile $set
  done
}
