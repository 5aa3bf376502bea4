#!/usr/bin/env bash
# The whole test run: environment, tools, lint, types, then every test suite.
# Usage: scripts/test.sh [pytest args]
#   TPUSERVE_SKIP_E2E=1 skips the control-plane suite;
#   TPUSERVE_SKIP_REAL_SGLANG=1 skips installing real SGLang and its tests (ignored under CI=true);
#   TPUSERVE_TEST_WORKERS=N runs the suites on N pytest-xdist workers (default: auto, one per
#   core, and two more when the e2e suite runs with the others; 0 runs them in pytest's own
#   process).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1

# Two installs run in the background, each in a process group of its own with its output in a
# log, while the foreground installs the virtualenv and the tools, lints and type-checks:
# - the control-plane build (no-op when the versioned binaries exist; 13-30 min of Go on a fresh
#   machine). When it is done by the time the tests start, every suite runs in one pytest run;
#   when it is not (a fresh machine), the unit and component suites run meanwhile and the e2e
#   suite after it. Its compiles run at nice 10, so they take mostly the CPU the foreground
#   leaves idle;
# - real SGLang (no-op when installed; a few minutes of downloads into its own venv on a fresh
#   machine), waited for before the tests.
# A job's log is printed when it is waited for. An early exit (a failed step) stops the jobs
# still running and drops their logs (the EXIT trap); a SIGKILL of this script leaves them
# running on their own (no trap runs then).
declare -A job_pid=() job_log=()
start_job() { # NAME COMMAND...
  local name=$1
  shift
  job_log[$name]=$(mktemp "${TMPDIR:-/tmp}/tpuserve-$name.XXXXXX")
  set -m # job control: a process group of its own, so stopping it stops its children too
  "$@" >"${job_log[$name]}" 2>&1 &
  job_pid[$name]=$!
  set +m
  echo "== $name: $* in the background, log ${job_log[$name]}"
}
wait_job() { # NAME: wait for it, print its log; exit with its status if it failed
  local name=$1 status=0
  [ -n "${job_pid[$name]:-}" ] || return 0
  echo "== $name (waiting for the background job, log ${job_log[$name]})"
  wait "${job_pid[$name]}" || status=$?
  unset "job_pid[$name]"
  cat "${job_log[$name]}" >&2
  rm -f "${job_log[$name]}"
  if [ "$status" != 0 ]; then
    echo "$name failed (exit $status); its output is above" >&2
    exit "$status"
  fi
}
stop_jobs() {
  local name
  for name in "${!job_pid[@]}"; do
    kill -- "-${job_pid[$name]}" 2>/dev/null || true
    rm -f "${job_log[$name]}"
  done
}
trap stop_jobs EXIT

skip_real_sglang=${TPUSERVE_SKIP_REAL_SGLANG:-0}
if [ "${CI:-}" = true ] && [ "$skip_real_sglang" = 1 ]; then
  echo "CI=true: ignoring TPUSERVE_SKIP_REAL_SGLANG=1, CI always runs the real-SGLang tests" >&2
  skip_real_sglang=0
fi
if [ "${TPUSERVE_SKIP_E2E:-0}" != 1 ]; then
  start_job control-plane scripts/build-control-plane.sh
fi
if [ "$skip_real_sglang" != 1 ]; then
  start_job real-sglang scripts/install-real-sglang.sh   # prints the paths it installed
fi

# shellcheck disable=SC1091
source scripts/tool-paths.sh
# Rust's build of router/native goes to one directory per machine, so a new clone (as CI is)
# rebuilds only the crate, not its dependencies; cargo's fingerprints decide what is stale.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$TPUSERVE_CACHE/cargo-target}
# mypy's cache likewise: a new clone re-checks only the files whose contents differ from the last
# run's (mypy compares hashes when mtimes differ), ~1 min less for every clone.
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-$TPUSERVE_CACHE/mypy-cache}
scripts/venv.sh dev
scripts/install-tools.sh                       # helm, kubectl, prometheus, promtool

echo "== ruff"
# one command a line: under `set -e` a failure before the last command of an && list does not
# stop the script (a lint error passed CI that way)
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== cargo (router/native)"
(
  cd router/native
  export PYO3_PYTHON="$PWD/../../.venv/bin/python"
  cargo fmt --check
  cargo clippy --quiet --release --locked --all-targets -- -D warnings
  cargo test --quiet --release --locked
)
wait_job real-sglang
if [ $# -gt 0 ]; then
  wait_job control-plane
  echo "== pytest $*"
  exec .venv/bin/pytest "$@"
fi
suites="unit or component"
if [ "$skip_real_sglang" = 1 ]; then
  suites="($suites) and not real_sglang"
fi
# Tests run on every core (pytest-xdist): `--dist loadgroup` keeps together what shares a
# fixture (tests/conftest.py, `xdist_group`), and the longest groups start first (their order is
# set there, hence `--no-loadscope-reorder`). Each run ends with its slowest tests.
workers=${TPUSERVE_TEST_WORKERS:-auto}
run_pytest() { # EXTRA_WORKERS MARKER_EXPRESSION: `auto` is one worker per core plus EXTRA_WORKERS
  local args=(--durations=30) n=$workers
  if [ "$n" != 0 ]; then
    [ "$n" = auto ] && n=$(($(nproc) + $1))
    args+=(-n "$n" --dist loadgroup --no-loadscope-reorder)
  fi
  .venv/bin/pytest "${args[@]}" -m "$2"
}
# Each long group holds a worker for its whole run, so each gets one on top of a worker per core
# for everything else: the real-SGLang engine pool (busy while engines start, idle between) and,
# when the e2e suite runs with the others, its three control planes (two living clusters and the
# session's; mostly waiting on timers: HPA windows, idle periods, drain grace).
if [ "${TPUSERVE_SKIP_E2E:-0}" = 1 ]; then
  echo "== pytest: $suites"
  run_pytest 1 "$suites"
elif kill -0 "${job_pid[control-plane]}" 2>/dev/null; then
  # The build still runs (a fresh machine): the suites that do not need it run meanwhile.
  echo "== pytest: $suites (while the control plane builds)"
  run_pytest 1 "$suites"
  wait_job control-plane
  echo "== pytest: e2e"
  run_pytest 1 e2e
else
  # One run of every suite: the control planes' waits overlap the CPU-bound tests.
  wait_job control-plane
  echo "== pytest: $suites, e2e"
  run_pytest 4 "($suites) or e2e"
fi
