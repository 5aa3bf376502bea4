#!/usr/bin/env bash
# Device call 8 (issue 71, item 1): compile mode with the KV pool's writes kept eager
# (sglang_tpu.sglang_torchtpu.keep_kv_pool_writes_eager, the fix call 7 pointed to) and the host
# cumsum, against the CPU references, with timed repeats. Carried as call 7 (.whl-tpu/, .tpu-carry/b/).
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
C=$PWD/.tpu-carry/b; W=${W:-$PWD/.whl-tpu}; S=/tmp/tpu-lane
T0=$(date +%s)
{ date -u; python3 -c 'import platform; print(platform.libc_ver())'; python3 -m pip list 2>/dev/null | grep -iE 'jax|libtpu|numpy|pydantic|transformers|torch'; } > $OUT/machine.txt 2>&1
path=$(scripts/tpu-lane-install.sh $S $W 2>>$OUT/install.log) || { echo install failed; tail $OUT/install.log; exit 1; }
if [ ! -f /tmp/tx/.ok ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --only-binary=:all: --no-cache-dir --index-url file:///opt/pypi/simple --target /tmp/tx transformers==5.17.0 pillow >> $OUT/install.log 2>&1 && touch /tmp/tx/.ok
fi
ls /tmp/tx >> $OUT/install.log
if [ ! -d /tmp/sg/sglang ]; then mkdir -p /tmp/sg && tar -xJf $C/sglang-0.5.23-py.tar.xz -C /tmp/sg; fi
mkdir -p /tmp/sg/sglang/kernels/jit/include /tmp/sg/sglang/kernels/jit/csrc
export PYTHONPATH=$C/repo:$path:/tmp/sg:/tmp/tx
export TPU_ACCELERATOR_TYPE=v5litepod-1 TPU_TOPOLOGY=1x1 TPU_CHIPS_PER_HOST_BOUNDS=1,1,1 TPU_HOST_BOUNDS=1,1,1
echo "install done in $(( $(date +%s) - T0 )) s"
B=$(( ${BUDGET_S:-520} - ( $(date +%s) - T0 ) ))
python3 $C/repo/bench/tpu_real_model.py drive --out-dir $OUT --impls sglang --modes compile \
  --shapes tiny qwen3-0.6b-4l --no-discovery --repeats 5 --extra="--host-cumsum --precision highest" --budget-s $B
echo "drive rc=$? total $(( $(date +%s) - T0 )) s"
cat $OUT/summary.json | python3 -c 'import json,sys; [print(r) for r in json.load(sys.stdin)["rows"]]' | cut -c1-900
