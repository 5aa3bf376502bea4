"""`sgl_kernel` for CPU-only machines: the two ops SGLang's CPU engine imports, in plain torch.

With `SGLANG_USE_CPU_ENGINE=1`, SGLang imports `assign_req_to_token_pool_cpu`
(`srt/mem_cache/allocation.py`) and `copy_all_layer_kv_cache_cpu`
(`kernels/ops/kvcache/cache_move.py`) from `sgl_kernel` when those modules load. The real CPU
kernels need AVX-512/AMX and PyPI's `sglang-kernel` wheel is CUDA-only, so this package provides
the two ops with the semantics of SGLang's Triton kernels of the same job.

Every other name resolves to a placeholder that raises `MissingKernelOp` (a NotImplementedError
naming the op) when called: SGLang's CPU branches import more ops than the Llama +
`torch_native` path ever calls (the speculative-decoding tree kernels, for one), so importing
must succeed, while an engine path that really needs another op fails loudly instead of
computing garbage.

torch is imported inside the functions: the package imports (and refuses unknown ops) without it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import torch

PROVIDED_OPS = ("assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu")
__all__ = ["PROVIDED_OPS", "MissingKernelOp", *PROVIDED_OPS]


class MissingKernelOp(NotImplementedError):
    """An `sgl_kernel` op this stand-in does not provide was called."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's newly allocated KV slots into its row of the req→token table.

    Request i owns row `req_pool_indices[i]` (`pool_len` entries wide) and gets positions
    `start_offset[i]:end_offset[i]`, filled from `out_cache_loc` where the requests' new slots lie
    back to back in batch order (request i's run starts after the lengths of requests 0..i-1).
    """
    table = req_to_token.view(-1)  # flat like the kernel's pointer arithmetic; needs contiguous
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        if length > 0:
            base = row * pool_len
            table[base + start : base + end] = out_cache_loc[taken : taken + length].to(table.dtype)
        taken += length


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy KV slots `src_loc[j]` → `tgt_loc[j]` in every buffer, as raw bytes.

    Buffer b starts at address `data_ptrs[b]` and one slot is `strides[b]` bytes (SGLang passes
    each layer's K and V buffers this way). All source rows are read before any target row is
    written, so overlapping source and target slots move correctly.
    """
    import torch

    if tgt_loc.numel() != src_loc.numel():
        raise ValueError(
            f"copy_all_layer_kv_cache_cpu: tgt_loc has {tgt_loc.numel()} slots, "
            f"src_loc {src_loc.numel()}; they must be equal"
        )
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        slots = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        slots[tgt] = slots[src]  # advanced indexing gathers a copy of the sources first


def _missing(name: str) -> Callable[..., NoReturn]:
    def missing_op(*args: object, **kwargs: object) -> NoReturn:
        raise MissingKernelOp(
            f"sgl_kernel.{name} is not provided by tpuserve's CPU stand-in for sgl_kernel (it "
            f"has only {', '.join(PROVIDED_OPS)}); this SGLang code path needs the real "
            "sglang-kernel build"
        )

    missing_op.__name__ = missing_op.__qualname__ = name
    return missing_op


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)  # module protocol probes (__path__, __wrapped__, ...)
    return _missing(name)
