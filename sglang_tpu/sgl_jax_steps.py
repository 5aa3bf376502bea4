"""SGLang-JAX's step-time constants and batch padding: the one place they are written down.

The performance model (`sglang_tpu.perf_model.StepTimer(..., engine="sglang-jax")`) times a
step as the same bare compiled device step as for SGLang (the device knobs of
`perf_model.Efficiency`, fitted to bare decoder steps on a v5e), plus what SGLang-JAX adds,
with two differences:

- **padding**: SGLang-JAX runs every step in a precompiled shape (`compilation_manager.py` at
  the pinned commit): a decode batch is padded up to the next batch-size bucket
  (`--precompile-bs-paddings`, default 1, 2, 4, ..., 256, capped by max running requests)
  and a prefill's tokens to the next token bucket (`--precompile-token-paddings`, default 64,
  128, ..., 8192, capped by the chunk). Padded rows cost their weight matmuls, not KV reads.
- **host**: a step costs `host_step_seconds` + `host_sequence_seconds` per sequence beyond
  the device step, and a request's prefill (to its first token) `prefill_request_seconds`
  more (tokenising, scheduling, detokenising the first token).

Sources (`SOURCE`): one v5e chip, 2026-12-07 (docs/sglang-jax.md, the reference's "Seen on one
v5e chip"): a Qwen3-0.6B-shaped model (28 layers, bf16, random weights, page 128, 128-token
prompts) decoded a step in 6.09 ms at batch 8 (padded to the batch-32 bucket) and 6.83 ms at
batch 32; a 512-token prefill plus one token took 22 ms. With the device model's 3.50 ms and
4.13 ms for those decode steps (160 tokens of context per sequence assumed: the prompt plus
half the output) and 5.13 ms for the prefill, the host terms follow exactly:
2.557 ms + 4.46 us per sequence per step, and 14.31 ms per prefill request. Two decode points
and one prefill point fix three constants: they are fitted, not yet validated. Whether
SGLang-JAX's overlap scheduler (on by default) hides host work behind the device step is
not visible in these figures: the 2.6 ms it adds per step is what it does not hide. The TPU
lane measures more rows (batch 1/8/32 decode, 1k/4k prefill) into bench/tpu_results/ and
`predict_row` is what each row is compared with; refit here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

SOURCE = "v5e, 2026-12-07: Qwen3-0.6B-shaped decode at batch 8 and 32, 512-token prefill"


@dataclass(frozen=True, slots=True)
class SglJaxSteps:
    """What SGLang-JAX adds to the bare compiled step, and how it pads."""

    host_step_seconds: float = 0.002557
    host_sequence_seconds: float = 0.00000446
    prefill_request_seconds: float = 0.01431
    bs_buckets: tuple[int, ...] = tuple(1 << i for i in range(9))  # 1 .. 256
    token_buckets: tuple[int, ...] = tuple(1 << i for i in range(6, 14))  # 64 .. 8192

    def __post_init__(self) -> None:
        for name in ("host_step_seconds", "host_sequence_seconds", "prefill_request_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not allowed; allowed: >= 0")
        for name in ("bs_buckets", "token_buckets"):
            buckets = getattr(self, name)
            if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
                raise ValueError(
                    f"{name}: {buckets!r} is not allowed; allowed: increasing integers >= 1"
                )


STEPS = SglJaxSteps()


def pad(count: int, buckets: tuple[int, ...]) -> int:
    """`count` rounded up to its bucket; 0 stays 0; past the largest bucket, unpadded (the
    engine splits what exceeds its largest shape: chunked prefill, capped batches)."""
    if count <= 0:
        return 0
    at = bisect.bisect_left(buckets, count)
    return buckets[at] if at < len(buckets) else count
