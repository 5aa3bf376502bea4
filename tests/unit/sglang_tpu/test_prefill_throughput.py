"""The peak prefill throughput that KEDA's backlogSeconds trigger divides queued tokens by."""

from __future__ import annotations

import pytest

from sglang_tpu import perf_model
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit


def _tps(
    generation: str,
    topology: str,
    model: str = "llama-3.1-8b",
    chunk_tokens: int = perf_model.BACKLOG_CHUNK_TOKENS,
    prompt_tokens: int = perf_model.BACKLOG_PROMPT_TOKENS,
) -> float:
    return perf_model.peak_prefill_tokens_per_second(
        lookup(generation, topology),
        perf_model.get_profile(model),
        chunk_tokens=chunk_tokens,
        prompt_tokens=prompt_tokens,
    )


def test_it_is_one_full_prefill_step_of_the_calibrated_timer() -> None:
    shape, profile = lookup("v6e", "2x2"), perf_model.get_profile("llama-3.1-8b")
    step = perf_model.StepTimer(shape, profile).step_seconds(
        prefill_tokens=8192, prefill_attention_context=4 * 2048 * 2049 // 2
    )
    assert _tps("v6e", "2x2") == pytest.approx(8192 / step)


def test_more_chips_prefill_more_and_a_larger_model_less() -> None:
    assert _tps("v6e", "2x4") > _tps("v6e", "2x2") > _tps("v5e", "2x2")
    assert _tps("v6e", "2x4", "llama-3.3-70b") < _tps("v6e", "2x4")


def test_longer_prompts_cost_more_attention_per_token() -> None:
    assert _tps("v6e", "2x2", prompt_tokens=8192) < _tps("v6e", "2x2", prompt_tokens=512)


def test_an_empty_step_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        _tps("v6e", "2x2", chunk_tokens=0)
