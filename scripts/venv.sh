#!/usr/bin/env bash
# Create or refresh the project's virtual environment (.venv) with the given extras.
# Re-installs only when pyproject.toml or the extras change. Usage: scripts/venv.sh [extras]
#
# Installs go through uv (PyPI's `uv`, bootstrapped once per machine with pip into
# $TPUSERVE_CACHE/tools): it resolves and installs the dev extra from its cache in seconds where
# pip takes a minute and a half, which every new clone (CI's included) pays.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh
# shellcheck disable=SC1091
source scripts/find-uv.sh
extras=${1:-}
venv=${TPUSERVE_VENV:-.venv}

find_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  echo "tpuserve needs Python 3.11 or newer on PATH (python3.11, python3.12 or python3.13)" >&2
  return 1
}

python=$(find_python)
uv=$(find_uv "$python")
if [ ! -x "$venv/bin/python" ]; then
  # --seed: pip in the venv too, for the scripts and users that call `.venv/bin/python -m pip`
  "$uv" venv --quiet --seed --python "$python" "$venv"
fi
hash=$(sha256sum pyproject.toml | cut -c1-16)
stamp="$venv/.installed-$hash-${extras:-base}"
if [ ! -f "$stamp" ]; then
  spec="."
  [ -n "$extras" ] && spec=".[$extras]"
  "$uv" pip install --quiet --python "$venv/bin/python" --editable "$spec"
  # Stamps of an older pyproject.toml are stale; the base install is part of every extra.
  find "$venv" -maxdepth 1 -name '.installed-*' ! -name ".installed-$hash-*" -delete
  touch "$stamp" "$venv/.installed-$hash-base"
fi
# The router's compiled block index: cargo rebuilds it only when router/native changed.
"$venv/bin/python" scripts/build_native.py >/dev/null
