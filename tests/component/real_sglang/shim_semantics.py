"""Check tpuserve's pure-torch `sgl_kernel` ops against naive references (run by the venv's python).

Run with the real-SGLang venv's python and the shim on PYTHONPATH (see
`tests/component/real_sglang/test_real_sglang_cpu_shim.py`): needs torch, which .venv lacks.
Builds the tensors the way SGLang's callers do (`srt/mem_cache/allocation.py`,
`srt/mem_cache/memory_pool.py`), compares every case element by element, prints one line per
op with the number of cases checked, and exits non-zero with the first mismatch.
"""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang_tpu.cpu_shim import sgl_kernel
else:
    import sgl_kernel  # as SGLang imports it: the shim's folder is on PYTHONPATH

CASES = 200


def naive_assign(
    rows: list[int], table: torch.Tensor, starts: list[int], ends: list[int], out: list[int]
) -> torch.Tensor:
    """Request i's slots `out[offset_i : offset_i + end_i - start_i]` go to row i's positions."""
    expected = table.clone()
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        for position in range(start, end):
            expected[row, position] = out[offset + position - start]
        offset += end - start
    return expected


def check_assign(rng: random.Random) -> None:
    pool_rows, pool_len = rng.randint(1, 8), rng.randint(1, 64)
    table = torch.randint(-5, 5, (pool_rows, pool_len), dtype=torch.int32)
    batch = rng.randint(1, pool_rows)
    rows = rng.sample(range(pool_rows), batch)
    starts, ends = [], []
    for _ in rows:
        start = rng.randint(0, pool_len)
        starts.append(start)
        ends.append(rng.randint(start, pool_len))
    out = [
        rng.randint(0, 10_000) for _ in range(sum(e - s for s, e in zip(starts, ends, strict=True)))
    ]
    expected = naive_assign(rows, table, starts, ends, out)
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor(rows, dtype=torch.int64),
        table,
        torch.tensor(starts, dtype=torch.int64),
        torch.tensor(ends, dtype=torch.int64),
        torch.tensor(out, dtype=torch.int64),
        pool_len,
    )
    if not torch.equal(table, expected):
        sys.exit(f"assign_req_to_token_pool_cpu differs: rows={rows} starts={starts} ends={ends}")


def check_copy(rng: random.Random) -> None:
    slots = rng.randint(2, 40)
    shapes_dtypes = [
        ((slots, rng.randint(1, 4), rng.randint(1, 16)), torch.bfloat16),
        ((slots, rng.randint(1, 4), rng.randint(1, 16)), torch.float32),
        ((slots, rng.randint(1, 32)), torch.int8),
    ]
    buffers = [torch.randn(shape).to(dtype) for shape, dtype in shapes_dtypes]
    count = rng.randint(0, slots // 2)
    chosen = rng.sample(range(slots), 2 * count)
    # Half the cases overlap: some targets are also sources, as in SGLang's in-place moves.
    src = chosen[:count]
    tgt = rng.sample(chosen, count) if rng.random() < 0.5 else chosen[count:]
    snapshots = [b.clone() for b in buffers]
    expected = [b.clone() for b in buffers]
    for before, after in zip(snapshots, expected, strict=True):
        for s, t in zip(src, tgt, strict=True):
            after[t] = before[s]
    index_dtype = rng.choice([torch.int64, torch.int32])
    sgl_kernel.copy_all_layer_kv_cache_cpu(
        torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64),
        torch.tensor([b.stride(0) * b.element_size() for b in buffers]),
        torch.tensor(tgt, dtype=index_dtype),
        torch.tensor(src, dtype=index_dtype),
    )
    for number, (got, want) in enumerate(zip(buffers, expected, strict=True)):
        if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
            sys.exit(f"copy_all_layer_kv_cache_cpu differs in buffer {number}: {src} -> {tgt}")


def main() -> None:
    rng = random.Random(12)
    for _ in range(CASES):
        check_assign(rng)
    print(f"assign_req_to_token_pool_cpu: {CASES} cases match")
    for _ in range(CASES):
        check_copy(rng)
    print(f"copy_all_layer_kv_cache_cpu: {CASES} cases match")


if __name__ == "__main__":
    main()
