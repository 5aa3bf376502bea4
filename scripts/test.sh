#!/usr/bin/env bash
# The whole test run: environment, tools, lint, types, then every test suite.
# Usage: scripts/test.sh [pytest args]
#   TPUSERVE_SKIP_E2E=1 skips the control-plane suite;
#   TPUSERVE_SKIP_REAL_SGLANG=1 skips installing real SGLang and its tests (ignored under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1

scripts/venv.sh dev
scripts/install-tools.sh                       # helm, kubectl, prometheus, promtool
if [ "${TPUSERVE_SKIP_E2E:-0}" != 1 ]; then
  scripts/build-control-plane.sh               # no-op when the versioned binaries exist
fi
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
