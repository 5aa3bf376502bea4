#!/usr/bin/env bash
# Install the external tools the tests drive (helm, kubectl, prometheus, promtool) into the
# tool cache; a no-op when they are present. See scripts/tool-paths.sh for where they land.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh
mkdir -p "$TPUSERVE_TOOLS_BIN"
