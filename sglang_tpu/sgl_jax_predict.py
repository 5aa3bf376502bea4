"""The performance model's prediction for one measured SGLang-JAX row (the TPU lane's tables).

The TPU lane times SGLang-JAX on the v5e (decode steps at batch 1, 8 and 32, prefills of 1k
and 4k tokens, a Qwen3-0.6B-shaped model with random bf16 weights) and writes each row next
to what the model predicts, with the model's error. `predict_row` is that prediction:

    from sglang_tpu.sgl_jax_predict import predict_row
    predict_row("decode", batch=8, context=160)        # seconds per decode step
    predict_row("prefill", tokens=1024)                 # seconds to the first token

"Qwen3-0.6B-shaped" is the profile `qwen3-0.6b` (28 layers, hidden 1024, 16 heads, 8 KV
heads, head dim 128, tied embeddings). The constants behind it are in `sgl_jax_steps`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from sglang_tpu.perf_model import StepTimer, get_profile
from sglang_tpu.sgl_jax_steps import STEPS
from sglang_tpu.topology import lookup

MODEL = "qwen3-0.6b"
"""The profile of the Qwen3-0.6B-shaped rows."""


def predict_row(
    kind: Literal["decode", "prefill"],
    *,
    batch: int = 1,
    context: int = 0,
    tokens: int = 0,
    model: str = MODEL,
    generation: str = "v5e",
    topology: str = "1x1",
    quantization: str = "bf16",
    bs_buckets: tuple[int, ...] | None = None,
    token_buckets: tuple[int, ...] | None = None,
) -> float:
    """Predicted seconds for one row: a decode step of `batch` sequences holding `context`
    tokens each, or one request's prefill of `tokens` new tokens to its first token.
    `bs_buckets` / `token_buckets`: the server's `--precompile-bs-paddings` /
    `--precompile-token-paddings` when the run set them (default: SGLang-JAX's)."""
    steps = STEPS
    if bs_buckets is not None:
        steps = replace(steps, bs_buckets=tuple(bs_buckets))
    if token_buckets is not None:
        steps = replace(steps, token_buckets=tuple(token_buckets))
    timer = StepTimer(
        lookup(generation, topology),
        get_profile(model, "model"),
        quantization,
        engine="sglang-jax",
        sgl_jax=steps,
    )
    if kind == "decode":
        if batch < 1 or context < 0:
            raise ValueError(
                f"batch {batch}, context {context}: not allowed; allowed: batch >= 1, context >= 0"
            )
        return timer.decode_step_seconds(batch, batch * context)
    if kind == "prefill":
        if tokens < 1:
            raise ValueError(f"tokens: {tokens!r} is not allowed; allowed: >= 1")
        return timer.prefill_seconds(tokens)
    raise ValueError(f"kind: {kind!r} is not allowed; allowed: decode, prefill")
