#!/usr/bin/env bash
# Device call 1 (issue 67, item 4): SGLang-JAX (source cddbf6f1, Python 3.11 with its one PEP 695
# line changed) on the v5e behind `tpuserve router`, everything over unix sockets: the tiny Qwen3's
# tokens on the chip against the machine's CPU, cached tokens, then the Qwen3-0.6B shape's steps
# and compile seconds. Run from the lead's checkout with .tpu-carry/ holding this branch's
# router/tpuserve_router (with _native.abi3.so), sglang_tpu, tpuserve and bench files as repo/,
# SGLang-JAX's python/sgl_jax as sgl_jax-cddbf6f1.tar.xz and 62 cp311 wheels in whl/
# (docs/tpu-lane.md, "SGLang-JAX on the chip").
set -u
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
C=$PWD/.tpu-carry; L=/tmp/sgj-logs; T0=$(date +%s)
mkdir -p $L
{ date -u; python3 -c 'import platform, sys; print(platform.libc_ver(), sys.version)'
  python3 -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|libtpu|numpy|pydantic|flax) '
  echo "PYTHONPATH=$PYTHONPATH"; nproc; free -g | head -2; } > $OUT/machine.txt 2>&1
if [ ! -f /tmp/site/.ok ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site $C/whl/*.whl > $L/install.log 2>&1 \
    && touch /tmp/site/.ok || { tail -20 $L/install.log; exit 1; }
fi
if [ ! -d /tmp/sgj/sgl_jax ]; then
  mkdir -p /tmp/sgj && xz -dc $C/sgl_jax-cddbf6f1.tar.xz | tar x -C /tmp/sgj
  # Python 3.11: the one PEP 695 generic class, as typing.Generic (issue 67; the reference page)
  sed -i 's/^class _Communicator\[T\]:$/T = __import__("typing").TypeVar("T")\nclass _Communicator(__import__("typing").Generic[T]):/' \
    /tmp/sgj/sgl_jax/srt/managers/tokenizer_manager.py
fi
grep -n -A1 '^T = __import__' /tmp/sgj/sgl_jax/srt/managers/tokenizer_manager.py >> $OUT/machine.txt
export PYTHONPATH=$PYTHONPATH:/tmp/site:$C/repo
cd $C/repo
[ -f /tmp/sgj-models/tiny/model.safetensors ] || python3 bench/sglang_jax_models.py --root /tmp/sgj-models >> $OUT/machine.txt 2>&1
echo "setup done in $(( $(date +%s) - T0 )) s"
B=$(( ${BUDGET_S:-565} - ( $(date +%s) - T0 ) ))
python3 bench/tpu_sglang_jax.py --out-dir $OUT --log-dir $L --models /tmp/sgj-models --sgl-path /tmp/sgj \
  --run-dir /tmp/sgj-run --budget-s $B --phases ${PHASES:-tiny perf}
echo "lane rc=$? total $(( $(date +%s) - T0 )) s"
tar cf - -C $L . | xz -6 -T0 > $OUT/logs.tar.xz
