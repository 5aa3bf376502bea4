#!/usr/bin/env bash
# Build SGLang-JAX (sgl_jax) for CPU runs in the tests, from a source checkout, into its own cached
# venv outside .venv, and build its tiny offline test model. OPT-IN: not part of CI nor of
# scripts/test.sh's default path (PyPI's sglang-jax 0.0.2 does not serve, and the project never
# fetches source itself: the user points this script at a checkout). A no-op when both exist.
#
# Usage: scripts/build-sglang-jax.sh [SRC]          build when needed, then print the paths
#        scripts/build-sglang-jax.sh --check [SRC]  print the paths; exit 1 (saying why) if not built
# SRC: a git checkout of github.com/sgl-project/sglang-jax (the directory holding python/), or
#      $TPUSERVE_SGLANG_JAX_SRC. --check needs no SRC (the venv is found by the pinned commit).
# Env: TPUSERVE_SGLANG_JAX_ANY_COMMIT=1 builds a checkout at another commit than the pinned one
#      (with a warning; its venv is keyed by that commit, and the tests use the pinned one only
#      when it is there, else the newest other build), TPUSERVE_CACHE.
#
# Printed (shell-sourceable): SGLANG_JAX_COMMIT, SGLANG_JAX_VENV, SGLANG_JAX_PYTHON,
# SGLANG_JAX_MODEL.
#
# - The venv is $TPUSERVE_CACHE/sglang-jax/venv-<commit12>-<key>, the key hashing the Python
#   version and scripts/sglang-jax-requirements.txt (the checkout's pyproject with the `cpu`
#   extra, resolved and pinned). A stamp file written last marks a complete build; a venv without
#   it (an interrupted run) is rebuilt.
# - Python 3.12 or 3.13 (sgl_jax requires >=3.12: one PEP 695 class). Wheels only for the
#   dependencies, through uv (scripts/find-uv.sh) and its cache; sgl_jax is built from the
#   checkout with --no-deps. Afterwards its serving modules are imported once, so a missing
#   package fails here, not in a test.
# - The tiny model (sglang_tpu/tiny_qwen3.py: Qwen3, head_dim 128, random weights, the local
#   tokenizer) is built into $TPUSERVE_CACHE/sglang-jax/models.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/tool-paths.sh
# shellcheck disable=SC1091
source scripts/find-uv.sh

PINNED_COMMIT=cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176
REQUIREMENTS=scripts/sglang-jax-requirements.txt
ROOT=$TPUSERVE_CACHE/sglang-jax
MODELS=$ROOT/models
STAMP_NAME=.tpuserve-installed
# What the server imports at start-up (launcher, HTTP server, scheduler, tokenizer and detokenizer
# managers, model runner, the Qwen3 model, the native attention backend CPU forces).
SERVING_MODULES=(
  sgl_jax.launch_server
  sgl_jax.srt.entrypoints.http_server
  sgl_jax.srt.managers.scheduler
  sgl_jax.srt.managers.tokenizer_manager
  sgl_jax.srt.managers.detokenizer_manager
  sgl_jax.srt.model_executor.model_runner
  sgl_jax.srt.models.qwen3
  sgl_jax.srt.layers.attention.native_backend
)

log() { printf '[build-sglang-jax] %s\n' "$*" >&2; }

mode=build
src=${TPUSERVE_SGLANG_JAX_SRC:-}
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    -*) log "unknown option '$arg'; allowed: --check, or a source directory"; exit 2 ;;
    *) src=$arg ;;
  esac
done

find_python() {
  local candidate
  for candidate in python3.12 python3.13 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 \
    "$HOME"/.pyenv/versions/3.13*/bin/python3.13; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if (3, 12) <= sys.version_info < (3, 14) else 1)' \
        2>/dev/null; then
      "$candidate" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  log "ERROR: SGLang-JAX needs Python 3.12 or 3.13 (python3.12 on PATH, or pyenv's 3.12)"
  return 1
}

base_python=$(find_python)
python_tag=$("$base_python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
key=$({ echo "python $python_tag"; cat "$REQUIREMENTS"; } | sha256sum | cut -c1-12)
model=$("$base_python" -m sglang_tpu.tiny_qwen3 --root "$MODELS" --print-dir)

commit=$PINNED_COMMIT
if [ -n "$src" ]; then
  [ -f "$src/python/pyproject.toml" ] ||
    { log "ERROR: '$src' is not an SGLang-JAX checkout (no python/pyproject.toml in it)"; exit 2; }
  commit=$(git -C "$src" rev-parse HEAD 2>/dev/null) ||
    { log "ERROR: '$src' is not a git checkout: its commit cannot be checked"; exit 2; }
  if [ "$commit" != "$PINNED_COMMIT" ]; then
    if [ "${TPUSERVE_SGLANG_JAX_ANY_COMMIT:-}" != 1 ]; then
      log "ERROR: '$src' is at commit $commit; the pinned commit is $PINNED_COMMIT"
      log "(check it out, or set TPUSERVE_SGLANG_JAX_ANY_COMMIT=1 to build another commit untested)"
      exit 2
    fi
    log "WARNING: building commit $commit, not the pinned $PINNED_COMMIT (untested)"
  fi
fi
venv=$ROOT/venv-${commit:0:12}-$key

print_paths() {
  printf 'SGLANG_JAX_COMMIT=%s\nSGLANG_JAX_VENV=%s\nSGLANG_JAX_PYTHON=%s\nSGLANG_JAX_MODEL=%s\n' \
    "$commit" "$venv" "$venv/bin/python" "$model"
}

venv_ready() { [ -f "$venv/$STAMP_NAME" ]; }
model_ready() { "$base_python" -m sglang_tpu.tiny_qwen3 --root "$MODELS" --check >/dev/null; }

if [ "$mode" = check ]; then
  print_paths
  if ! venv_ready; then
    log "SGLang-JAX ${commit:0:8} is not built in $venv (run scripts/build-sglang-jax.sh SRC)"
    exit 1
  fi
  if ! model_ready; then
    log "the tiny test model is not built in $model (run scripts/build-sglang-jax.sh SRC)"
    exit 1
  fi
  exit 0
fi

uv_install() { # into the venv; uv's output goes to the build log
  nice -n 10 "$uv" pip install --python "$venv/bin/python" --compile-bytecode "$@" \
    >>"$build_log" 2>&1 ||
    { tail -n 30 "$build_log" >&2; log "ERROR: uv pip install $* failed (log: $build_log)"; exit 1; }
}

build_venv() {
  local started=$SECONDS
  [ -n "$src" ] || {
    log "ERROR: SGLang-JAX is not built; name a checkout of sgl-project/sglang-jax at"
    log "${PINNED_COMMIT:0:8}: scripts/build-sglang-jax.sh SRC (or TPUSERVE_SGLANG_JAX_SRC=SRC)"
    exit 2
  }
  log "building sgl_jax ${commit:0:8} from $src and its CPU stack into $venv"
  rm -rf "$venv"
  uv=$(find_uv "$base_python")
  "$uv" venv --quiet --python "$base_python" "$venv"
  build_log=$venv/build.log
  uv_install --only-binary :all: -r "$REQUIREMENTS"
  # Built from the checkout (setuptools-scm reads its version from git), dependencies pinned above.
  uv_install --no-deps "$src/python"
  log "importing the serving modules"
  JAX_PLATFORMS=cpu "$venv/bin/python" -W ignore - "${SERVING_MODULES[@]}" <<'EOF_PY' ||
import importlib, sys
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except ImportError as err:
        sys.exit(f"{module} does not import: {err}")
EOF_PY
    { log "ERROR: a package is missing from $REQUIREMENTS"; exit 1; }
  printf '%s %s\n' "$(date -u +%FT%TZ)" "$commit" >"$venv/$STAMP_NAME"
  log "built in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1))"
  local old
  for old in "$ROOT"/venv-*; do
    if [ "$old" != "$venv" ] && [ -d "$old" ] && [[ "$old" == "$ROOT/venv-${commit:0:12}-"* ]]; then
      log "removing the superseded $old"
      rm -rf "$old"
    fi
  done
}

mkdir -p "$ROOT"
exec 9>"$ROOT/.build.lock"
flock 9 # one build at a time per machine
if venv_ready; then
  log "sgl_jax ${commit:0:8} present in $venv"
else
  build_venv
fi
if ! model_ready; then
  log "building the tiny test model"
  PYTHONPATH=$PWD TRANSFORMERS_VERBOSITY=error \
    nice -n 10 "$venv/bin/python" -m sglang_tpu.tiny_qwen3 --root "$MODELS" >/dev/null
fi
print_paths
