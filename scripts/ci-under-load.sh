#!/usr/bin/env bash
# CI on a busy machine: a clean clone of this checkout's HEAD, `.ci/run` in it, with CPU-burning
# processes beside it for the whole run, as a shared runner or a fresh machine's control-plane
# build gives it. A test that fails only here is a question about the product (what does the
# router do when it is slow?), answered in the product, never by loosening the test.
#
# Usage: scripts/ci-under-load.sh [RUNS] [BURNERS]    (defaults: 1 run, 2 burners)
# Each run's output goes to $TPUSERVE_LOAD_LOGS (default ~/.local/state/tpuserve/ci-under-load)
# as run-N.log; the script prints each run's exit status and seconds, and exits with the first
# failed run's status (it stops there). The clone shares this machine's caches (the control
# plane, real SGLang, uv, cargo), like CI's own clean clone: set TPUSERVE_CACHE to an empty
# folder for a fresh-machine run.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
burners=${2:-2}
for value in "$runs" "$burners"; do
  if ! [[ $value =~ ^[0-9]+$ ]] || [ "$value" -lt 1 ] || [ "$value" -gt 16 ]; then
    echo "usage: scripts/ci-under-load.sh [RUNS] [BURNERS]: each a whole number 1..16, got '$value'" >&2
    exit 2
  fi
done
logs=${TPUSERVE_LOAD_LOGS:-$HOME/.local/state/tpuserve/ci-under-load}
mkdir -p "$logs"
head=$(git rev-parse HEAD)
work=$(mktemp -d "${TMPDIR:-/tmp}/tpuserve-ci-load.XXXXXX")
burner_pids=()
stop_burners() {
  local pid
  for pid in "${burner_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  burner_pids=()
}
cleanup() {
  stop_burners
  rm -rf "$work"
}
trap cleanup EXIT

for run in $(seq 1 "$runs"); do
  clone="$work/run-$run"
  git clone --quiet --no-local "$PWD" "$clone"
  git -C "$clone" checkout --quiet "$head"
  for _ in $(seq 1 "$burners"); do
    python3 -c 'while True: pass' &
    burner_pids+=($!)
  done
  log="$logs/run-$run.log"
  echo "== run $run/$runs: $head in $clone, $burners CPU burners beside it, log $log"
  start=$SECONDS
  status=0
  (cd "$clone" && CI=true bash .ci/run) >"$log" 2>&1 || status=$?
  stop_burners
  echo "== run $run: exit $status after $((SECONDS - start)) s"
  grep -E '^(FAILED|ERROR) |[0-9]+ (passed|failed)' "$log" | tail -n 20 || true
  rm -rf "$clone"
  if [ "$status" != 0 ]; then
    exit "$status"
  fi
done
