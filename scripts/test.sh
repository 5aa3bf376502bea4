#!/usr/bin/env bash
# The whole test run: environment, tools, lint, types, then every test suite.
# Usage: scripts/test.sh [pytest args]   (TPUSERVE_SKIP_E2E=1 skips the control-plane suite)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1

scripts/venv.sh dev
scripts/install-tools.sh                       # helm, kubectl, prometheus, promtool
if [ "${TPUSERVE_SKIP_E2E:-0}" != 1 ]; then
  scripts/build-control-plane.sh               # no-op when the versioned binaries exist
fi
# shellcheck disable=SC1091
source scripts/tool-paths.sh

echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi
.venv/bin/pytest -m "unit or component"
if [ "${TPUSERVE_SKIP_E2E:-0}" != 1 ]; then
  .venv/bin/pytest -m e2e
fi
