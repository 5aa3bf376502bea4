#!/usr/bin/env bash
# Device call 1: JAX grid, then TorchTPU install and the cold TorchTPU rows (cache probe A).
set -u
export PYTHONUNBUFFERED=1
W=.whl-tpu
{
  date -u; uname -a; python3 -c 'import platform; print(platform.libc_ver())'
  env | grep -E '^(TPU_|PYTHONPATH|JAX)' ; nproc; free -g | head -2
  python3 -m pip list 2>/dev/null | grep -iE 'jax|libtpu|numpy|torch|pytest|pydantic|yaml|msgspec'
  ls /opt/wheels | head -30
} > $OUT/machine.txt 2>&1
timeout 330 python3 bench/tpu_steps.py --framework jax --out $OUT --repeats 10 --budget-s 290 > $OUT/jax.log 2>&1
echo "jax rc=$?"
S=/tmp/tsite; mkdir -p $S
if [ ! -f $S/.ok ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --only-binary=:all: --index-url file:///opt/pypi/simple --target $S torch==2.13.0 --find-links /opt/wheels > $OUT/install.log 2>&1
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S $W/*.whl >> $OUT/install.log 2>&1
  tar -xJf $W/torch_tpu-0.2.0.tar.xz -C $S && touch $S/.ok
fi
echo "install done"; tail -3 $OUT/install.log
export PYTHONPATH=$PWD/$W/libtpu-shim:$S:$PYTHONPATH
probe() { # TAG T3 IND ROWS...
  local tag=$1 t3=$2 ind=$3; shift 3
  rm -rf /dev/shm/torch_tpu_cache; mkdir -p /tmp/cc/home-$tag
  ( export HOME=/tmp/cc/home-$tag XDG_CACHE_HOME=/tmp/cc/home-$tag/.cache TORCHINDUCTOR_CACHE_DIR=$ind
    [ -n "$t3" ] && export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=$t3
    python3 bench/tpu_steps.py --framework torch --out $OUT --repeats 10 --tag $tag --rows "$@" ) > $OUT/torch-$tag.log 2>&1
  echo "torch $tag rc=$?"
}
timeout 220 bash -c "$(declare -f probe); OUT=$OUT; probe cold /tmp/cc/t3a /tmp/cc/inda qwen3-0.6b:prefill:512 qwen3-0.6b:decode:8:1024 qwen3-1.7b:decode:8:1024 qwen3-4b:decode:8:1024"
du -sh /tmp/cc/* /dev/shm/torch_tpu_cache 2>&1 | tee $OUT/cache-sizes.txt
tail -5 $OUT/torch-cold.log
