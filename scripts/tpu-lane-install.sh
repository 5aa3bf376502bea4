#!/usr/bin/env bash
# Install what the TPU lane needs on a TPU machine without network: torch from the machine's
# own wheel directory, torch-tpu from its pre-unpacked tarball, the small wheels it (and the
# launch contract) needs, and a libtpu dist-info shim. Prints the PYTHONPATH to use.
#
# Usage: scripts/tpu-lane-install.sh SITE WHEELS
#   SITE    where to install (reused when a warm machine still has it), e.g. /tmp/tpu-lane
#   WHEELS  the carried folder (docs/tpu-lane.md): torch_tpu-*.tar.xz, *.whl
# Environment: TORCH_VERSION (default 2.13.0, the CPU build the machine's wheels hold);
#   LIBTPU_SHIM_VERSION (default 0.0.50: the libtpu version the shim reports, see below);
#   TPU_LANE_INDEX (default file:///opt/pypi/simple), TPU_LANE_FIND_LINKS (default /opt/wheels).
#
# The shim: the machine's libtpu reports 0.0.42.1, which torch-tpu 0.2.0's import refuses
# and which the pre-flight refuses by name. A dist-info reporting LIBTPU_SHIM_VERSION, first on
# PYTHONPATH, stands for an image that pins a libtpu torch-tpu accepts; the real libtpu.so is
# unchanged (docs/tpu-lane.md, "The libtpu shim"). Tests that need the machine's own libtpu metadata
# drop SITE/shim from PYTHONPATH.
set -euo pipefail
site=${1:?usage: scripts/tpu-lane-install.sh SITE WHEELS}
wheels=${2:?usage: scripts/tpu-lane-install.sh SITE WHEELS}
torch_version=${TORCH_VERSION:-2.13.0}
shim_version=${LIBTPU_SHIM_VERSION:-0.0.50}
index=${TPU_LANE_INDEX:-file:///opt/pypi/simple}
find_links=${TPU_LANE_FIND_LINKS:-/opt/wheels}
pip=(env PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated --quiet --no-cache-dir
  --no-compile --disable-pip-version-check)
mkdir -p "$site"

if [ ! -f "$site/torch/.installed-$torch_version" ]; then
  echo "tpu-lane-install: torch==$torch_version (CPU build) into $site/torch" >&2
  rm -rf "$site/torch"
  "${pip[@]}" --only-binary=:all: --index-url "$index" --target "$site/torch" \
    "torch==$torch_version" --find-links "$find_links"
  touch "$site/torch/.installed-$torch_version"
fi

tarball=$(find "$wheels" -maxdepth 1 -name 'torch_tpu-*.tar.xz' | sort | tail -n 1)
if [ -z "$tarball" ]; then
  echo "tpu-lane-install: no torch_tpu-*.tar.xz in $wheels (docs/tpu-lane.md says how to make it)" >&2
  exit 1
fi
stamp="$site/torch_tpu/.installed-$(basename "$tarball")"
if [ ! -f "$stamp" ]; then
  echo "tpu-lane-install: unpacking $tarball into $site/torch_tpu" >&2
  rm -rf "$site/torch_tpu"
  mkdir -p "$site/torch_tpu"
  tar -xJf "$tarball" -C "$site/torch_tpu"
  touch "$stamp"
fi
# The folder that holds the torch_tpu package (the tarball may wrap it in a folder or two).
package=$(find "$site/torch_tpu" -maxdepth 4 -path '*/torch_tpu/__init__.py' -print -quit)
if [ -z "$package" ]; then
  echo "tpu-lane-install: $tarball holds no torch_tpu/__init__.py" >&2
  exit 1
fi
torch_tpu_site=$(dirname "$(dirname "$package")")

shopt -s nullglob
carried=("$wheels"/*.whl)
if [ ${#carried[@]} -gt 0 ]; then
  "${pip[@]}" --no-index --no-deps --upgrade --target "$site/deps" "${carried[@]}"
fi

rm -rf "$site/shim"
mkdir -p "$site/shim/libtpu-$shim_version.dist-info"
printf 'Metadata-Version: 2.1\nName: libtpu\nVersion: %s\n' "$shim_version" \
  >"$site/shim/libtpu-$shim_version.dist-info/METADATA"

# Order: the shim first (it must hide the machine's libtpu metadata), the checkout, the
# carried wheels (pydantic for the launch contract, torch-tpu's small dependencies), the
# machine's own path (its JAX and numpy), then torch and torch-tpu.
echo "$site/shim:.:operator:router:$site/deps:${PYTHONPATH:-}:$site/torch:$torch_tpu_site"
