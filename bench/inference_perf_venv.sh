#!/usr/bin/env bash
# Install inference-perf (kubernetes-sigs' benchmark client, the one llm-d and GKE publish with)
# into its own virtual environment, outside the project's dependencies, for
# bench/inference_perf_run.py. Prints the environment's python. Usage: bench/inference_perf_venv.sh
# (idempotent). Its releases need Python >= 3.12: TOOL_PYTHON names one if PATH has none.
# INFERENCE_PERF_VERSION overrides the pinned release; TPUSERVE_INFERENCE_PERF_VENV the place.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tool-paths.sh
version=${INFERENCE_PERF_VERSION:-0.7.0}
venv=${TPUSERVE_INFERENCE_PERF_VENV:-$TPUSERVE_CACHE/bench/inference-perf-$version}
exec bench/tool_venv.sh "$venv" "inference-perf==$version" 3.12
