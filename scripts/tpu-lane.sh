#!/usr/bin/env bash
# The TPU lane: the tests that need a TPU chip (tests/tpu, marker `tpu`), run on a TPU machine
# from a plain checkout, with their results written as JSON (docs/tpu-lane.md).
#
# Usage: scripts/tpu-lane.sh OUT_DIR [pytest args, e.g. -k preflight]
# Environment: TPU_LANE_WHEELS (default .whl-tpu: the carried torch-tpu tarball and wheels),
#   TPU_LANE_SITE (default /tmp/tpuserve-tpu-lane: where they are installed, reused while the
#   machine stays warm), TPU_LANE_SINGLE_CHIP (default 1: pin the one-chip v5e environment,
#   v5litepod-1 / 1x1, which TorchTPU worked with where the machine says v5litepod-4 but shows
#   one chip; 0 keeps the machine's), and scripts/tpu-lane-install.sh's variables.
# Writes OUT_DIR/tpu-lane.json (date, chip, versions, each test's outcome, message and
# measurements) and OUT_DIR/tpu-lane.log; exits with pytest's status.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:?usage: scripts/tpu-lane.sh OUT_DIR [pytest args]}
shift
mkdir -p "$out"
site=${TPU_LANE_SITE:-/tmp/tpuserve-tpu-lane}
wheels=${TPU_LANE_WHEELS:-.whl-tpu}
path=$(scripts/tpu-lane-install.sh "$site" "$wheels") || exit 1
export PYTHONPATH="$path" TPU_LANE_SITE="$site" TPU_LANE_SHIM="$site/shim"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ "${TPU_LANE_SINGLE_CHIP:-1}" = 1 ]; then
  export TPU_ACCELERATOR_TYPE=v5litepod-1 TPU_TOPOLOGY=1x1 TPU_CHIPS_PER_HOST_BOUNDS=1,1,1 \
    TPU_HOST_BOUNDS=1,1,1
fi
# The project's pytest settings (pyproject.toml) name plugins a TPU machine lacks, and
# tests/conftest.py imports the whole project: the lane has its own ini and stops conftest
# discovery at tests/tpu.
python3 -m pytest -c tests/tpu/pytest.ini --rootdir=. --confcutdir=tests/tpu \
  -p tests.tpu.lane_report --lane-json "$out/tpu-lane.json" "$@" tests/tpu 2>&1 |
  tee "$out/tpu-lane.log"
exit "${PIPESTATUS[0]}"
