#!/usr/bin/env bash
# Install the real sglang-router (the anchor the live benchmark compares against) into its own
# virtual environment, outside the project's dependencies. Prints the environment's python.
# Usage: bench/routing_anchor_venv.sh            (idempotent; re-run is a no-op)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tool-paths.sh
version=${SGLANG_ROUTER_VERSION:-0.3.2}
venv=${TPUSERVE_ANCHOR_VENV:-$TPUSERVE_CACHE/bench/sglang-router-$version}
if [ ! -f "$venv/.installed" ]; then
  python=
  for candidate in python3.12 python3.11 python3; do
    if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  [ -n "$python" ] || { echo "no python3 on PATH" >&2; exit 1; }
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
  "$venv/bin/python" -m pip install --quiet "sglang-router==$version"
  touch "$venv/.installed"
fi
echo "$venv/bin/python"
