# Sourced by scripts/test.sh: a pass whose output goes to a log (the 3.x pass, printed when both passes are done)
# says how far it is, on stderr, every INTERVAL seconds (default 60) while it runs:
#   == the 3.x pass, 120 s: 37% of its tests done (now in tests/circuits/test_acdc.py), 2 failed so far
# read from pytest's own progress in the log (the "[ 37%]" at the end of its lines, the file names, F and E marks).
# Usage: pass_progress PID LOG LABEL [INTERVAL]; it returns within a second of the pass's end.
pass_progress() {
  local pid=$1 log=$2 label=$3 every=${4:-60} t0 i pct file failed
  t0=$(date +%s)
  while kill -0 "$pid" 2>/dev/null; do
    for ((i = 0; i < every; i++)); do
      sleep 1
      kill -0 "$pid" 2>/dev/null || return 0
    done
    pct=$(grep -oE '\[ *[0-9]+%\]' "$log" 2>/dev/null | tail -n 1 | tr -d '[] ')
    file=$(grep -oE '^tests/[^ ]+\.py' "$log" 2>/dev/null | tail -n 1)
    # the marks of the progress lines (their file name cut off): F a failure, E an error
    failed=$(grep -E '\[ *[0-9]+%\]$' "$log" 2>/dev/null | sed -E 's/^[^ ]+\.py //; s/\[ *[0-9]+%\]$//' | tr -cd 'FE' | wc -c)
    echo "== the $label pass, $(( $(date +%s) - t0 )) s: ${pct:-0%} of its tests done${file:+ (now in $file)}, $failed failed so far" >&2
  done
}
