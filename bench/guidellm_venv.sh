#!/usr/bin/env bash
# Install GuideLLM (the vLLM project's benchmark client) into its own virtual environment,
# outside the project's dependencies, for bench/guidellm_run.py. Prints the environment's
# python. Usage: bench/guidellm_venv.sh            (idempotent; re-run is a no-op)
# GUIDELLM_VERSION overrides the pinned release; TPUSERVE_GUIDELLM_VENV the place.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tool-paths.sh
version=${GUIDELLM_VERSION:-0.8.1}
venv=${TPUSERVE_GUIDELLM_VENV:-$TPUSERVE_CACHE/bench/guidellm-$version}
exec bench/tool_venv.sh "$venv" "guidellm==$version" 3.10
