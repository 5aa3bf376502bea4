#!/usr/bin/env bash
# Install a benchmark client into a virtual environment of its own, outside the project's
# dependencies, and print its python; idempotent (a re-run is a no-op).
# Usage: bench/tool_venv.sh VENV_DIR REQUIREMENT MIN_PYTHON   (e.g. ... guidellm==0.8.1 3.10)
# bench/routing_anchor_venv.sh and bench/guidellm_venv.sh call it with their pinned releases.
set -euo pipefail
venv=${1:?usage: bench/tool_venv.sh VENV_DIR REQUIREMENT MIN_PYTHON}
requirement=${2:?usage: bench/tool_venv.sh VENV_DIR REQUIREMENT MIN_PYTHON}
minimum=${3:?usage: bench/tool_venv.sh VENV_DIR REQUIREMENT MIN_PYTHON}
if [ ! -f "$venv/.installed" ]; then
  python=
  # TOOL_PYTHON first (e.g. a pyenv interpreter not active in this shell), then PATH's
  for candidate in ${TOOL_PYTHON:-} python3.13 python3.12 python3.11 python3; do
    if "$candidate" -c "import sys; sys.exit(0 if sys.version_info >= tuple(map(int, '$minimum'.split('.'))) else 1)" 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  [ -n "$python" ] || { echo "no python3 >= $minimum on PATH (set TOOL_PYTHON to one)" >&2; exit 1; }
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
  "$venv/bin/python" -m pip install --quiet "$requirement"
  touch "$venv/.installed"
fi
echo "$venv/bin/python"
