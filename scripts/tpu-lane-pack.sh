#!/usr/bin/env bash
# Pack what the TPU lane carries to a TPU machine without network into .whl-tpu/ (ignored by
# git; docs/tpu-lane.md): torch-tpu 0.2.0 unzipped, less the glue for torch versions the lane
# does not run (the loader takes the newest glue at or below the running torch), as one
# `tar | xz -9` under the 64 MiB a device call carries (~41 MB), and torch-tpu's small
# dependencies as wheels. Needs pip and PyPI here; xz takes ~5 min on 2 cores.
#
# Usage: scripts/tpu-lane-pack.sh [OUT_DIR]   (default .whl-tpu)
# Environment: TORCH_TPU_VERSION (0.2.0), KEEP_TORCH (2_13_0: the glue kept, for torch 2.13).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.whl-tpu}
version=${TORCH_TPU_VERSION:-0.2.0}
keep=${KEEP_TORCH:-2_13_0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=(--platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
download() {
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp "${platforms[@]}" -d "$1" "${@:2}"
}
mkdir -p "$out"
download "$work" "torch-tpu==$version"
download "$out" absl-py frozendict immutabledict portpicker "pyzmq>=27,<28"
mkdir -p "$work/site"
(cd "$work/site" && python3 -m zipfile -e "$work"/torch_tpu-*.whl .)
# Every glue library and extension built for another torch than $keep goes.
find "$work/site" -regextype posix-extended -regex '.*_2_1[0-9]_0(\.so|_common\.so)?$' \
  ! -name "*${keep}*" -prune -exec rm -rf {} +
(cd "$work/site" && tar cf - torch_tpu "torch_tpu-$version.dist-info") |
  xz -9 -T0 >"$out/torch_tpu-$version.tar.xz"
ls -la "$out"
