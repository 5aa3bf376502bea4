#!/usr/bin/env bash
# Install real SGLang (the release pyproject's `tpu` extra pins) for CPU runs in the tests, in its
# own cached venv outside .venv, and build the tiny offline test model. A no-op when both exist.
#
# Usage: scripts/install-real-sglang.sh           install when needed, then print the paths
#        scripts/install-real-sglang.sh --check   print the paths; exit 1 (saying why) if not ready
#
# Printed (shell-sourceable): SGLANG_VERSION, SGLANG_VENV, SGLANG_PYTHON, TINY_MODEL.
#
# - The venv is $TPUSERVE_CACHE/sglang/venv-<version>-<key>, the key hashing the Python version
#   and scripts/real-sglang-requirements.txt: changing a pin installs a new venv (older ones are
#   then removed; each is ~6.3 GB). A stamp file written last marks a complete install; a venv
#   without it (an interrupted run) is rebuilt.
# - PyPI only, wheels only, through uv (scripts/find-uv.sh) and its cache: sglang with --no-deps
#   (its metadata requires CUDA-only packages), then the pinned CPU serving stack, byte-compiled
#   as pip would (the tests run with PYTHONDONTWRITEBYTECODE=1). uv downloads the ~6 GB in
#   parallel and compiles on every core: a fresh install took 10-12 min through pip on a busy
#   machine. Afterwards the serving modules are
#   imported once as SGLang's CPU engine imports them, so a missing package fails here, not in
#   a test.
# - The tiny model (sglang_tpu/tiny_model.py) is built into $TPUSERVE_CACHE/sglang/models.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh
# shellcheck disable=SC1091
source scripts/find-uv.sh

REQUIREMENTS=scripts/real-sglang-requirements.txt
SHIM_DIR=sglang_tpu/cpu_shim
ROOT=$TPUSERVE_CACHE/sglang
MODELS=$ROOT/models
STAMP_NAME=.tpuserve-installed
# What SGLang's CPU server imports at start-up (launcher, scheduler, model, attention, the two
# modules that need sgl_kernel's CPU ops); importing them proves the requirement list complete.
SERVING_MODULES=(
  sglang.launch_server
  sglang.srt.entrypoints.http_server
  sglang.srt.managers.scheduler
  sglang.srt.managers.detokenizer_manager
  sglang.srt.model_executor.model_runner
  sglang.srt.models.llama
  sglang.srt.layers.attention.torch_native_backend
  sglang.srt.mem_cache.allocation
  sglang.kernels.ops.kvcache.cache_move
)

log() { printf '[install-real-sglang] %s\n' "$*" >&2; }

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) log "unknown argument '$1'; allowed: --check (or nothing)"; exit 2 ;;
esac

find_python() { # SGLang's wheels were verified on 3.11; newer versions work for the pip resolver
  for candidate in python3.11 python3.12 python3.13; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  log "ERROR: real SGLang needs python3.11, python3.12 or python3.13 on PATH"
  return 1
}

base_python=$(find_python)
version=$("$base_python" -c 'from tests.sglang_wheel import pinned_version; print(pinned_version())')
python_tag=$("$base_python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
key=$({ echo "python $python_tag"; cat "$REQUIREMENTS"; } | sha256sum | cut -c1-12)
venv=$ROOT/venv-$version-$key
model=$("$base_python" -m sglang_tpu.tiny_model --root "$MODELS" --print-dir)

print_paths() {
  printf 'SGLANG_VERSION=%s\nSGLANG_VENV=%s\nSGLANG_PYTHON=%s\nTINY_MODEL=%s\n' \
    "$version" "$venv" "$venv/bin/python" "$model"
}

venv_ready() { [ -f "$venv/$STAMP_NAME" ]; }
model_ready() { "$base_python" -m sglang_tpu.tiny_model --root "$MODELS" --check >/dev/null; }

if [ "$mode" = check ]; then
  print_paths
  if ! venv_ready; then
    log "real SGLang $version is not installed in $venv"
    exit 1
  fi
  if ! model_ready; then
    log "the tiny test model is not built in $model"
    exit 1
  fi
  exit 0
fi

uv_install() { # into the venv; uv's output goes to the install log
  nice -n 10 "$uv" pip install --python "$venv/bin/python" --only-binary :all: --compile-bytecode \
    "$@" >>"$install_log" 2>&1 ||
    { tail -n 30 "$install_log" >&2; log "ERROR: uv pip install $* failed (log: $install_log)"; exit 1; }
}

install_venv() {
  local started=$SECONDS
  log "installing sglang==$version and its CPU serving stack into $venv (~6.3 GB, ~2.5-5 min fresh)"
  rm -rf "$venv"
  uv=$(find_uv "$base_python")
  "$uv" venv --quiet --python "$base_python" "$venv"
  install_log=$venv/install.log
  uv_install --no-deps "sglang==$version"
  uv_install -r "$REQUIREMENTS"
  log "importing the serving modules as SGLang's CPU engine does"
  SGLANG_USE_CPU_ENGINE=1 CUDA_VISIBLE_DEVICES="" PYTHONPATH="$SHIM_DIR" \
    "$venv/bin/python" -W ignore - "${SERVING_MODULES[@]}" <<'EOF_PY' ||
import importlib, sys
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except ImportError as err:
        sys.exit(f"{module} does not import: {err}")
EOF_PY
    { log "ERROR: a package is missing from $REQUIREMENTS"; exit 1; }
  date -u +%FT%TZ >"$venv/$STAMP_NAME"
  log "installed in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1))"
  local old
  for old in "$ROOT"/venv-*; do
    if [ "$old" != "$venv" ] && [ -d "$old" ]; then
      log "removing the superseded $old"
      rm -rf "$old"
    fi
  done
}

mkdir -p "$ROOT"
exec 9>"$ROOT/.install.lock"
flock 9 # one install at a time per machine (parallel CI jobs, helpers)
if venv_ready; then
  log "sglang $version present in $venv"
else
  install_venv
fi
if ! model_ready; then
  log "building the tiny test model"
  PYTHONPATH=$PWD HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error \
    nice -n 10 "$venv/bin/python" -m sglang_tpu.tiny_model --root "$MODELS" >/dev/null
fi
print_paths
