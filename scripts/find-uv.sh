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
    # Another process (CI's venv and its real-SGLang install start side by side on a fresh
    # machine) may have put its uv in place meanwhile and be running it: never remove a working
    # one. A broken leftover is renamed aside first; `mv -T` renames onto a missing name only,
    # so of two racing installs one wins whole and the other drops its own copy.
    if [ -x "$dir/bin/uv" ]; then
      rm -rf "$staging"
    else
      if [ -e "$dir" ]; then
        local broken
        broken=$(mktemp -u "$dir.broken.XXXXXX")
        mv -T "$dir" "$broken" 2>/dev/null && rm -rf "$broken"
      fi
      mv -T "$staging" "$dir" 2>/dev/null || rm -rf "$staging"
    fi
  fi
  echo "$dir/bin/uv"
}
