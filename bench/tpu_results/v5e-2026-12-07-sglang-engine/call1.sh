#!/usr/bin/env bash
# Device call 1 (issue 71, item 2): SGLang 0.5.23's own engine (scheduler, radix cache,
# tokenizer and detokenizer) in one process (sglang_tpu/sglang_one_process.py: threads, the
# in-process fake process group, no TCP socket), its model on the v5e through
# sglang_tpu/sglang_device_bridge.py. Run from the lead's checkout with .whl-tpu/ (torch-tpu),
# .tpu-carry/b/sglang-0.5.23-py.tar.xz (SGLang's .py sources) and .tpu-carry/c/ (this branch's
# sglang_tpu and bench files as repo/, six small wheels in whl/) carried.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
R=$PWD; C=$R/.tpu-carry/c; W=$R/.whl-tpu; S=/tmp/tpu-lane; T0=$(date +%s)
{ date -u; python3 -c 'import platform, sys; print(platform.libc_ver(), sys.version)'
  python3 -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|libtpu|numpy|pydantic|jinja2|psutil) '; } > $OUT/machine.txt 2>&1
path=$(scripts/tpu-lane-install.sh $S $W 2>>$OUT/install.log) || { echo install failed; tail $OUT/install.log; exit 1; }
if [ ! -f /tmp/tx/.ok ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --only-binary=:all: --no-cache-dir \
    --index-url file:///opt/pypi/simple --target /tmp/tx transformers==5.17.0 pillow >> $OUT/install.log 2>&1 && touch /tmp/tx/.ok
fi
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/cx $C/whl/*.whl >> $OUT/install.log 2>&1 || echo "carried wheels failed"
if [ ! -d /tmp/sg/sglang ]; then mkdir -p /tmp/sg && tar -xJf $R/.tpu-carry/b/sglang-0.5.23-py.tar.xz -C /tmp/sg; fi
mkdir -p /tmp/sg/sglang/kernels/jit/include /tmp/sg/sglang/kernels/jit/csrc
cd $C/repo   # "." on the lane's path is this branch's copy
export PYTHONPATH=$C/repo:$C/repo/sglang_tpu/cpu_shim:$path:/tmp/sg:/tmp/tx:/tmp/cx  # cpu_shim: sgl_kernel in pure torch
export TPU_ACCELERATOR_TYPE=v5litepod-1 TPU_TOPOLOGY=1x1 TPU_CHIPS_PER_HOST_BOUNDS=1,1,1 TPU_HOST_BOUNDS=1,1,1
M=/tmp/sgl-models
[ -f $M/tiny/model.safetensors ] || python3 bench/sglang_jax_models.py --root $M >> $OUT/install.log 2>&1
if [ ! -d $M/qwen3-0.6b-4l ]; then cp -r $M/qwen3-0.6b $M/qwen3-0.6b-4l
  python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['num_hidden_layers']=4; json.dump(c,open(p,'w'))" $M/qwen3-0.6b-4l/config.json; fi
echo "setup done in $(( $(date +%s) - T0 )) s"
E="python3 bench/sglang_engine_chip.py --out $OUT/engine.jsonl --stubs --no-tcp"
left() { echo $(( ${BUDGET_S:-570} - ( $(date +%s) - T0 ) )); }
run() { local t=$1; shift; local l=$(left); [ $l -lt 30 ] && { echo "skip $*: budget"; return; }
  [ $t -gt $l ] && t=$l; echo "== $* (timeout $t, at $(( $(date +%s) - T0 )) s)"
  timeout $t $E "$@" --budget-s $(( t - 20 )) 2>>$OUT/children.log | cut -c1-400; echo "rc=${PIPESTATUS[0]}"; }
run 120 --label cpu-ref --model $M/tiny --device cpu
run 150 --label tpu-eager-tiny --model $M/tiny --device tpu --bridge --phases tokens perf
run 200 --label tpu-compile-tiny --model $M/tiny --device tpu --bridge --compile --phases tokens perf --perf-new 8
run 150 --label tpu-eager-0.6b-4l --model $M/qwen3-0.6b-4l --device tpu --bridge --dtype bfloat16 \
  --load-format dummy --precision "" --phases perf --perf-vocab 150000
echo "total $(( $(date +%s) - T0 )) s"
