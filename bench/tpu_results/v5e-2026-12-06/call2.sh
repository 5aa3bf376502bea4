#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
W=.whl-tpu
D=""
for m in qwen3-4b qwen3-0.6b llama-3.2-1b qwen3-1.7b; do for c in 1024 4096; do for b in 1 8 32 64; do D="$D $m:decode:$b:$c"; done; done; done
timeout 100 python3 bench/tpu_steps.py --framework jax --out $OUT --repeats 10 --budget-s 80 --tag flash2 --rows qwen3-4b:prefill:128 qwen3-4b:prefill:512 qwen3-4b:prefill:2048 qwen3-4b:prefill:8192 qwen3-0.6b:prefill:16384 > $OUT/jax-flash2.log 2>&1; echo "jax flash rc=$?"
timeout 170 python3 bench/tpu_steps.py --framework jax --out $OUT --repeats 10 --budget-s 150 --attention dense --tag dense --rows $D qwen3-0.6b:decode:16:4096 qwen3-0.6b:decode:24:4096 llama-3.2-1b:decode:32:8192 qwen3-4b:decode:16:4096 qwen3-4b:decode:12:4096 > $OUT/jax-dense.log 2>&1; echo "jax dense rc=$?"
S=/tmp/tsite
ls $S/.ok || echo "NO TORCH SITE"
export PYTHONPATH=$PWD/$W/libtpu-shim:$S:$PYTHONPATH
probe() { # TAG T3 IND ROWS...
  local tag=$1 t3=$2 ind=$3; shift 3
  rm -rf /dev/shm/torch_tpu_cache; mkdir -p /tmp/cc/home-$tag
  ( export HOME=/tmp/cc/home-$tag XDG_CACHE_HOME=/tmp/cc/home-$tag/.cache TORCHINDUCTOR_CACHE_DIR=$ind
    [ -n "$t3" ] && export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=$t3
    timeout 100 python3 bench/tpu_steps.py --framework torch --out $OUT --repeats 10 --tag $tag --rows "$@" ) > $OUT/torch-$tag.log 2>&1
  echo "torch $tag rc=$?"
}
R="qwen3-0.6b:prefill:512 qwen3-0.6b:decode:8:1024"
probe warm-both /tmp/cc/t3a /tmp/cc/inda $R
probe warm-t3only /tmp/cc/t3a /tmp/cc/indc $R
probe warm-indonly "" /tmp/cc/inda $R
du -sh /tmp/cc/* /dev/shm/torch_tpu_cache 2>&1 | tee $OUT/cache-sizes2.txt
grep -h "^qwen\|^llama" $OUT/*.log
