#!/usr/bin/env bash
# The whole test run: environment, tools, lint, types, then every test suite.
# Usage: scripts/test.sh [pytest args]
#   TPUSERVE_SKIP_E2E=1 skips the control-plane suite;
#   TPUSERVE_SKIP_REAL_SGLANG=1 skips installing real SGLang and its tests (ignored under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1

# The control-plane build (no-op when the versioned binaries exist; 13-30 min of Go on a fresh
# machine) runs in the background while the rest is installed and linted, and is waited for
# before the tests, which it would otherwise slow down. Its log is printed then (and dropped if
# an earlier step fails: the EXIT trap stops the build). A SIGKILL of this script leaves the
# build running on its own (no trap runs then).
control_plane_pid=""
control_plane_log=""
stop_control_plane() { # an early exit: stop the build (its whole process group), drop its log
  [ -n "$control_plane_pid" ] || return 0
  kill -- "-$control_plane_pid" 2>/dev/null || true
  rm -f "$control_plane_log"
}
trap stop_control_plane EXIT
wait_for_control_plane() {
  [ -n "$control_plane_pid" ] || return 0
  echo "== control plane (waiting for the background build, log $control_plane_log)"
  local status=0
  wait "$control_plane_pid" || status=$?
  control_plane_pid=""
  cat "$control_plane_log" >&2
  rm -f "$control_plane_log"
  if [ "$status" != 0 ]; then
    echo "scripts/build-control-plane.sh failed (exit $status); its output is above" >&2
    exit "$status"
  fi
}
if [ "${TPUSERVE_SKIP_E2E:-0}" != 1 ]; then
  control_plane_log=$(mktemp "${TMPDIR:-/tmp}/tpuserve-control-plane.XXXXXX")
  set -m  # job control: the build gets a process group of its own, so the trap stops its go too
  scripts/build-control-plane.sh >"$control_plane_log" 2>&1 &
  control_plane_pid=$!
  set +m
  echo "== control plane: scripts/build-control-plane.sh in the background, log $control_plane_log"
fi

scripts/venv.sh dev
scripts/install-tools.sh                       # helm, kubectl, prometheus, promtool
skip_real_sglang=${TPUSERVE_SKIP_REAL_SGLANG:-0}
if [ "${CI:-}" = true ] && [ "$skip_real_sglang" = 1 ]; then
  echo "CI=true: ignoring TPUSERVE_SKIP_REAL_SGLANG=1, CI always runs the real-SGLang tests" >&2
  skip_real_sglang=0
fi
if [ "$skip_real_sglang" != 1 ]; then
  scripts/install-real-sglang.sh >/dev/null    # no-op when the venv and the tiny model exist
fi
# shellcheck disable=SC1091
source scripts/tool-paths.sh

echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== cargo (router/native)"
(
  cd router/native
  export PYO3_PYTHON="$PWD/../../.venv/bin/python"
  cargo fmt --check
  cargo clippy --quiet --release --locked --all-targets -- -D warnings
  cargo test --quiet --release --locked
)
wait_for_control_plane
echo "== pytest"
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi
if [ "$skip_real_sglang" = 1 ]; then
  .venv/bin/pytest -m "(unit or component) and not real_sglang"
else
  .venv/bin/pytest -m "unit or component"
fi
if [ "${TPUSERVE_SKIP_E2E:-0}" != 1 ]; then
  .venv/bin/pytest -m e2e
fi
