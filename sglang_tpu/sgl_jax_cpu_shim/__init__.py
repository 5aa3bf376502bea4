"""SGLang-JAX on the cpu development device: Pallas TPU kernels in TPU interpret mode.

SGLang-JAX's model forward runs on CPU (its `native` attention is pure JAX), but two of its
paths write the device KV pool through a Pallas TPU kernel (`kv_cache_update_impl`,
`srt/kernels/update_kv_cache/update_kv_cache.py`, a `pl.pallas_call` without ``interpret``):
the host tier's load back (`LRUHostKVPool.flush_load` -> `memory_pool.write_kv_layer`) and
PD's decode-side KV write. On CPU JAX refuses such a kernel ("Only interpret mode is supported
on CPU backend.", `jax/_src/pallas/pallas_call.py`) and the scheduler dies.

JAX's TPU interpret mode runs Pallas TPU kernels on CPU, simulating their memory spaces, DMAs
and semaphores (`jax.experimental.pallas.tpu.set_tpu_interpret_mode`, a process-wide switch).
SGLang-JAX starts its scheduler and detokenizer with multiprocessing's ``spawn``, so the switch
has to be thrown in every process it starts: `sitecustomize.py` beside this file does it when
Python starts. The launcher puts `PYTHONPATH_ENTRY` on the server's PYTHONPATH on the cpu
device only (`sglang_tpu.launch`); on a TPU the kernels compile for the chip as they are.
Being first on the path, it shadows any other `sitecustomize` the interpreter would run.
"""

from __future__ import annotations

from pathlib import Path

PYTHONPATH_ENTRY = Path(__file__).resolve().parent
