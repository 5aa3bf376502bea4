#!/usr/bin/env bash
# The main job: a local tpuserve fleet on loopback. Extra arguments go to `tpuserve up`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/venv.sh
exec .venv/bin/tpuserve up "$@"
