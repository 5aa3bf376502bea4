#!/usr/bin/env bash
# Build CPython 3.11 the way the image's base (python:3.11-slim-bookworm, docker-library's
# build) is built, and a virtual environment on it holding this checkout; prints the
# environment's python. The router's CPU depends on how its interpreter was compiled: the
# image's is profile-guided and link-time optimized (--enable-optimizations --with-lto), a
# developer's pyenv build usually is neither. bench/router_side_by_side.py --python runs the
# routers under test on it.
#
# Usage: bench/image_python_venv.sh [image|plain]   (idempotent; re-run is a no-op)
#   image  configured as docker-library's 3.11 bookworm images (PGO, LTO, shared libpython)
#   plain  the same source configured as pyenv configures it (shared libpython, no PGO or LTO)
#
# The source is CPython 3.11.2 as Debian's archive serves it (the upstream tarball, checked
# against its SHA-256), since python.org is out of reach on this project's machines. A PGO
# build runs CPython's own test subset to profile: about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tool-paths.sh
flavour=${1:-image}
case "$flavour" in
  image) configure_flags=(--enable-optimizations --with-lto) ;;
  plain) configure_flags=() ;;
  *) echo "image_python_venv.sh: flavour '$flavour' is not one of: image, plain" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || {
  echo "image_python_venv.sh: no .venv/bin/python (its pinned packages are copied):" \
    "run scripts/venv.sh dev first" >&2
  exit 2
}
version=3.11.2
sha256=2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849
url=http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_$version.orig.tar.gz
root=$TPUSERVE_CACHE/bench/cpython-$version-$flavour
venv=$root-venv
if [ ! -x "$root/bin/python3.11" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  curl -fsSL --max-time 600 -o "$work/src.tar.gz" "$url"
  echo "$sha256  $work/src.tar.gz" | sha256sum --check --quiet
  tar -xzf "$work/src.tar.gz" -C "$work"
  cd "$work/Python-$version"
  gnu_arch=$(dpkg-architecture --query DEB_BUILD_GNU_TYPE)
  ./configure --quiet --build="$gnu_arch" --prefix="$root" --enable-loadable-sqlite-extensions \
    --enable-option-checking=fatal --enable-shared --with-system-expat --without-ensurepip \
    "${configure_flags[@]}"
  extra_cflags=$(dpkg-buildflags --get CFLAGS)
  ldflags=$(dpkg-buildflags --get LDFLAGS)
  jobs=$(nproc)
  make --quiet -j "$jobs" "EXTRA_CFLAGS=$extra_cflags" "LDFLAGS=$ldflags -Wl,-rpath=$root/lib" \
    > "$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
  make --quiet install > "$work/install.log" 2>&1 || { tail -40 "$work/install.log" >&2; exit 1; }
  cd - > /dev/null
fi
if [ ! -f "$venv/.installed" ]; then
  rm -rf "$venv"
  "$root/bin/python3.11" -m venv --without-pip "$venv"
  # pip from the project's venv (this build has no ensurepip), then the project and its pins
  .venv/bin/python -m pip freeze --exclude-editable > "$venv.requirements.txt"
  .venv/bin/python -m pip --python "$venv/bin/python" install --quiet \
    -r "$venv.requirements.txt" hatchling
  .venv/bin/python -m pip --python "$venv/bin/python" install --quiet --no-deps \
    --no-build-isolation --editable .
  touch "$venv/.installed"
fi
echo "$venv/bin/python"
