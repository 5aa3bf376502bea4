"""The persistent compilation cache: where TorchTPU and torch.compile keep compiled programs.

Compiling a model for a TPU slice (XLA through TorchTPU) takes minutes to tens of minutes;
a new replica of the same model on the same slice shape can load the programs instead.
`TPUSERVE_COMPILE_CACHE_DIR` is a directory the operator backs with a volume shared by the
replicas (a ReadWriteMany PVC or a GCS FUSE mount); unset, nothing persists.

What is cached (torch_tpu 0.2.0):

- ``torch_tpu/``: TorchTPU's tier-3 compilation cache (`TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`),
  the compiled PJRT executables. TorchTPU keys each entry by its own compilation cache key
  (the program and its compile options) and fingerprints its binary, so entries from another
  TorchTPU build are not reused; it keeps each process's entries under its own path below
  the root. Sources: vllm-torchtpu's docs/user_guide/compilation_cache.md and the strings
  of the torch_tpu 0.2.0 wheel ("Tier-3 compilation cache root directory", "Tier-2 cache uses
  TorchTPU binary fingerprint"); the exact key contents are not documented [unconfirmed].
- ``inductor/``: torch.compile's FX-graph and AOTAutograd caches (`TORCHINDUCTOR_CACHE_DIR`),
  keyed by PyTorch by graph hash, PyTorch version and device.

Seen on a TPU v5e (torch_tpu 0.2.0, the TPU lane: docs/tpu-lane.md): with the tier-3 root set
TorchTPU writes its entries under `<root>/<TorchTPU binary fingerprint>/` and also enables
tier 2; a second process then compiled the same decoder steps in a fifth of the cold time.
But a third process with TorchTPU's tiers off was as fast: PyTorch's own caches (FX graph and
AOTAutograd, by default under `/tmp/torchinductor_<user>`) persisted too. So both go to the
volume, and the launcher switches PyTorch's caches on explicitly (`INDUCTOR_SWITCHES`) rather
than rely on defaults that differ between PyTorch releases; which store holds what is
measured by the TPU lane (tests/tpu/test_warm_compile_on_chip.py).

Below it, TorchTPU keeps a tier-2 cache in shared memory, `/dev/shm/torch_tpu_cache/<name>`,
named by `TORCH_TPU_TIER2_COMPILATION_CACHE` (the pod mounts a memory-backed `/dev/shm`, an
emptyDir that outlives container restarts). The launcher always sets it (`tier2_cache_env`):
alone it is the only cache that TorchTPU keeps for world size 1 ("Tier-2 compilation cache is
disabled for world size 1" otherwise).

SGLang-JAX (`TPUSERVE_ENGINE=sglang-jax`) keeps its compiled programs in JAX's persistent
compilation cache: its scheduler reads `JAX_COMPILATION_CACHE_DIR` at start and then caches
every compile (`jax_persistent_cache_min_compile_time_secs` 0 unless
`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` is set, no size gate, XLA's sub-caches included;
read from sgl_jax's `Scheduler._setup_jit_cache` at the pinned commit). Its precompile of the
token and batch-size buckets at start is what the cache saves: on a v5e, 68 s of a 90.6 s
start for a 28-layer model (docs/sglang-jax.md). The launcher points the variable at
``jax/`` under the same key (`jax_cache_env`); TorchTPU's variables are not set for it.

Keys tpuserve adds (`cache_key`, the one place the key is computed; the operator shows it in
``status.compileCache.key``): the directory is split per
``<generation>-<topology>/<model>/<engine version>``, so one shared volume serves several
models, slice shapes and engine images, a replica only reads entries made for its shape by
the same engine (a new image, with another SGLang, TorchTPU or libtpu, starts a new
directory instead of trusting TorchTPU's fingerprint alone), and the cache of a retired
model or engine can be deleted as one directory.
"""

from __future__ import annotations

import re

from sglang_tpu.contract.group_contract import GroupContract

TIER3_ROOT_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TIER2_CACHE_ENV = "TORCH_TPU_TIER2_COMPILATION_CACHE"
JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
TIER2_CACHE_NAME = "tpuserve-compilation-cache"  # under /dev/shm/torch_tpu_cache/
# PyTorch's persistent caches under TORCHINDUCTOR_CACHE_DIR: the FX-graph and AOTAutograd
# caches (on by default in recent releases; set so that a release that changes the default
# still persists them).
INDUCTOR_SWITCHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _path_safe(text: str) -> str:
    return _UNSAFE.sub("_", text.replace("://", "_")).strip("_")


def cache_key(contract: GroupContract) -> str:
    """`<generation>-<topology>/<model>/<engine version>`, each part made path-safe."""
    model = _path_safe(str(contract.source))
    engine = _path_safe(contract.engine_version)
    return f"{contract.generation}-{contract.topology}/{model}/{engine}"


def cache_dir(contract: GroupContract) -> str | None:
    if contract.compile_cache_dir is None:
        return None
    return f"{contract.compile_cache_dir.rstrip('/')}/{cache_key(contract)}"


def compile_cache_dirs(contract: GroupContract) -> dict[str, str]:
    """The variables naming the shared cache's directories (TorchTPU's tier 3, PyTorch's)."""
    root = cache_dir(contract)
    if root is None:
        return {}
    return {TIER3_ROOT_ENV: f"{root}/torch_tpu", INDUCTOR_ENV: f"{root}/inductor"}


def compile_cache_env(contract: GroupContract) -> dict[str, str]:
    """The variables that point TorchTPU and torch.compile at the shared cache."""
    dirs = compile_cache_dirs(contract)
    return dirs | INDUCTOR_SWITCHES if dirs else {}


def tier2_cache_env() -> dict[str, str]:
    """TorchTPU's shared-memory (tier-2) compilation cache, by its name under /dev/shm."""
    return {TIER2_CACHE_ENV: TIER2_CACHE_NAME}


def jax_cache_env(contract: GroupContract) -> dict[str, str]:
    """SGLang-JAX's cache: `JAX_COMPILATION_CACHE_DIR` under the key (none without a cache)."""
    root = cache_dir(contract)
    return {} if root is None else {JAX_CACHE_ENV: f"{root}/jax"}
