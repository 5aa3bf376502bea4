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
if [ ! -f "$venv/.installed" ]; then
  python=
  for candidate in python3.12 python3.11 python3; do
    if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  [ -n "$python" ] || { echo "no python3 >= 3.10 on PATH" >&2; exit 1; }
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
  "$venv/bin/python" -m pip install --quiet "guidellm==$version"
  touch "$venv/.installed"
fi
echo "$venv/bin/python"
