#!/usr/bin/env bash
# The live KEDA ramp on the local cluster (issue 60), recorded: builds KEDA if needed
# (scripts/build-keda.sh, opt-in), then runs tests/e2e/test_keda_live.py with its timeline
# printed, into bench/keda_results/<date>/ (the build's log and the test's output).
#
# Usage: bench/keda_live.sh [OUT_DIR]    (default: bench/keda_results/$(date -u +%F))
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/keda_results/$(date -u +%F)}
mkdir -p "$out"
{ time scripts/build-keda.sh; } 2>&1 | grep -v '^go: downloading' | tee "$out/build-keda.txt"
{ time .venv/bin/pytest -m e2e -s -p no:cacheprovider tests/e2e/test_keda_live.py; } 2>&1 |
  tee "$out/keda_live.txt"
