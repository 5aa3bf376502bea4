#!/usr/bin/env bash
# Install the real sglang-router (the anchor the live benchmark compares against) into its own
# virtual environment, outside the project's dependencies. Prints the environment's python.
# Usage: bench/routing_anchor_venv.sh            (idempotent; re-run is a no-op)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tool-paths.sh
version=${SGLANG_ROUTER_VERSION:-0.3.2}
venv=${TPUSERVE_ANCHOR_VENV:-$TPUSERVE_CACHE/bench/sglang-router-$version}
exec bench/tool_venv.sh "$venv" "sglang-router==$version" 3.9
