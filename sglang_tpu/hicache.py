"""SGLang's hierarchical KV cache (HiCache): the host-memory tier as tpuserve uses it.

One place for what the operator, the launcher, the engine twin and the router need to know of
HiCache, read from the pinned SGLang 0.5.23 wheel (`docs/host-kv-tier.md` gives the file and
line of each fact):

- the flags and their defaults (`sglang/srt/arg_groups/fields/memory.py`): a host pool of
  `--hicache-size` GB (10**9 bytes) per rank, else `--hicache-ratio` times the device pool
  (default 2.0, reduced until the pools fit `--hicache-host-memory-fraction` 0.8 of the
  memory left after a 10 GiB reserve);
- the write policies and when each copies a node to host (`WRITE_THROUGH_HITS`);
- the `medium` of the KV events (`StorageMedium` in `sglang/srt/disaggregation/kv_events.py`):
  ``GPU`` for device memory (HBM on a TPU) and ``CPU_PINNED`` for the host tier;
- how much of a host's memory the tier may take (`max_size_gb`): SGLang itself refuses a pool
  larger than the container's headroom less its 10 GiB reserve, shared by the host's ranks
  (`sglang/srt/mem_cache/pool_host/base.py`), so the operator refuses it earlier, at apply.
"""

from __future__ import annotations

import math
from typing import Final, Literal

from sglang_tpu.kv_events import MEDIUM_GPU, MEDIUM_HOST
from sglang_tpu.topology import GIB, SliceShape

WritePolicy = Literal["write_through", "write_through_selective", "write_back"]
WRITE_POLICIES: Final[tuple[WritePolicy, ...]] = (
    "write_through",
    "write_through_selective",
    "write_back",
)
DEFAULT_WRITE_POLICY: Final[WritePolicy] = "write_through"
WRITE_THROUGH_HITS: Final[dict[WritePolicy, int | None]] = {
    "write_through": 1,
    "write_through_selective": 2,
    "write_back": None,
}
"""Hits after which a device node is copied to host (`write_through_threshold`); None: only
when it is evicted from the device (write back)."""

DEFAULT_RATIO: Final = 2.0
"""`--hicache-ratio`'s default in SGLang's `cache` host-memory mode."""
DEFAULT_HOST_MEMORY_FRACTION: Final = 0.8
"""`--hicache-host-memory-fraction`: the share of the headroom an auto-sized pool may take."""
GB: Final = 10**9
"""`--hicache-size` counts decimal gigabytes (`host_size * 1e9 // size_per_token`)."""
SGLANG_RESERVE_BYTES: Final = 10 * GIB
"""`HICACHE_HOST_MEMORY_RESERVE_BYTES`: what SGLang leaves free when it sizes a host pool."""
ENGINE_HOST_BYTES: Final = 16 * GIB
"""Host memory the engine process takes besides the pool (Python, the runtime, tokenizer,
buffers) [estimate: not measured on a TPU host]."""

MEDIA: Final = (MEDIUM_GPU, MEDIUM_HOST)
"""The `medium` of KV events: device memory (HBM on a TPU), then the host pool."""

FLAG_ENABLE: Final = "--enable-hierarchical-cache"
FLAG_SIZE: Final = "--hicache-size"
FLAG_RATIO: Final = "--hicache-ratio"
FLAG_WRITE_POLICY: Final = "--hicache-write-policy"
FLAG_IO_BACKEND: Final = "--hicache-io-backend"
IO_BACKEND: Final = "direct"
"""The copy path the launcher asks for: `kernel` (SGLang's default) is CUDA/ROCm kernels;
`direct` copies with torch. That TorchTPU's build takes `direct` is unconfirmed."""


def ranks_per_host(shape: SliceShape) -> int:
    """SGLang's ranks on one host: the launcher runs one TP rank per TorchTPU device."""
    return shape.devices_per_host


def pool_budget_bytes(memory_limit_bytes: float) -> float:
    """Host memory one engine pod may give its host pools: its memory limit less the
    engine's own needs and SGLang's reserve (never below 0)."""
    return max(0.0, memory_limit_bytes - ENGINE_HOST_BYTES - SGLANG_RESERVE_BYTES)


def max_size_gb(shape: SliceShape, memory_limit_bytes: float) -> int:
    """The largest `--hicache-size` (GB per rank) an engine pod with this memory limit holds."""
    return math.floor(pool_budget_bytes(memory_limit_bytes) / ranks_per_host(shape) / GB)


def host_bytes_per_host(
    shape: SliceShape, *, size_gb: int | None, ratio: float | None, device_pool_bytes: float
) -> float:
    """Bytes of host pool on one host: `size_gb` per rank, else `ratio` (default 2.0) times
    the host's share of the slice's device pool (`device_pool_bytes`, the whole slice's)."""
    if size_gb is not None:
        return float(size_gb * GB * ranks_per_host(shape))
    return (DEFAULT_RATIO if ratio is None else ratio) * device_pool_bytes / shape.hosts


def flags(size_gb: int | None, ratio: float | None, write_policy: str) -> list[str]:
    """SGLang's arguments for a host tier (no size nor ratio: SGLang sizes it itself)."""
    out = [FLAG_ENABLE, FLAG_WRITE_POLICY, write_policy, FLAG_IO_BACKEND, IO_BACKEND]
    if size_gb is not None:
        out += [FLAG_SIZE, str(size_gb)]
    elif ratio is not None:
        out += [FLAG_RATIO, f"{ratio:g}"]
    return out
