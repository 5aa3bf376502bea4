#!/usr/bin/env bash
# Device call 7 (issue 71, item 1): where SGLang's compiled step goes wrong. The tiny shape's
# compiled prefill and decode step against the eager ones in one process, TORCH_LOGS=graph_breaks,
# then the same with the KV pool's writes kept eager (bench/tpu_compile_diagnosis.py). Run from
# the lead's checkout with .whl-tpu/ (docs/tpu-lane.md, plus msgspec and dill) and .tpu-carry/b/
# holding this branch's bench/ and sglang_tpu/ as repo/ and SGLang's .py sources as
# sglang-0.5.23-py.tar.xz; transformers 5.17.0 and pillow from the machine's own index.
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
C=$PWD/.tpu-carry/b; W=${W:-$PWD/.whl-tpu}; S=/tmp/tpu-lane
T0=$(date +%s)
{ date -u; python3 -c 'import platform; print(platform.libc_ver())'; python3 -m pip list 2>/dev/null | grep -iE 'jax|libtpu|numpy|pydantic|transformers|torch|pillow'; } > $OUT/machine.txt 2>&1
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
for variant in "" "--eager-kv-writes"; do
  left=$(( ${BUDGET_S:-560} - ( $(date +%s) - T0 ) ))
  [ $left -gt 60 ] || { echo "no time left for '$variant'"; break; }
  name=diag${variant:+-eager-kv}
  TORCH_LOGS=graph_breaks timeout $(( left < 270 ? left : 270 )) python3 $C/repo/bench/tpu_compile_diagnosis.py \
    --device tpu --host-cumsum --precision highest $variant --out $OUT/diag.jsonl 2> $OUT/$name.log
  echo "$name rc=$? total $(( $(date +%s) - T0 )) s"
  grep -E "^F[0-9]{4}|Check failed|Error" $OUT/$name.log | head -5
done
