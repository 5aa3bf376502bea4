# Sourced by scripts/venv.sh and scripts/install-real-sglang.sh: `find_uv PYTHON` prints the path
# of uv (PyPI's `uv`), installing it the first time with PYTHON's pip into the machine's tool cache
# ($TPUSERVE_CACHE/tools, from scripts/tool-paths.sh). uv installs from its cache in seconds where
# pip takes minutes, and downloads in parallel on a fresh machine.
UV_SPEC="uv>=0.13,<0.14"

find_uv() { # PYTHON
  local dir=$TPUSERVE_CACHE/tools/uv-0.13 staging
  if [ ! -x "$dir/bin/uv" ]; then
    mkdir -p "$TPUSERVE_CACHE/tools"
    staging=$(mktemp -d "$TPUSERVE_CACHE/tools/.uv.XXXXXX")
    "$1" -m pip install --quiet --disable-pip-version-check --target "$staging" "$UV_SPEC" >&2 ||
      { rm -rf "$staging"; echo "installing $UV_SPEC from PyPI with pip failed" >&2; return 1; }
    rm -rf "$dir"
    mv "$staging" "$dir" 2>/dev/null || rm -rf "$staging" # another clone may have won the race
  fi
  echo "$dir/bin/uv"
}
