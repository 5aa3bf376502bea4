"""tpuserve.bench.pd_split: the prefix-cache estimate and the split's inputs."""

from __future__ import annotations

import pytest

from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.topology import lookup
from tpuserve.bench.pd_split import Cache, PdRequest, Pools, split

pytestmark = pytest.mark.unit

SHAPE = lookup("v6e", "1x1")
TIMER = StepTimer(SHAPE, get_profile("llama-3.1-8b"))
KV = kv_pool_tokens(SHAPE, get_profile("llama-3.1-8b"))


def test_the_cache_estimate_holds_the_leading_blocks_seen() -> None:
    cache = Cache(block_tokens=64)
    assert cache.held((1, 2, 3)) == 0
    cache.add((1, 2, 3))
    assert cache.held((1, 2, 9)) == 128
    assert cache.held((7, 2, 3)) == 0  # only a leading run counts


def test_prefill_heavy_streams_get_more_prefill_engines_than_decode_heavy_ones() -> None:
    def stream(prompt: int, output: int) -> list[PdRequest]:
        return [PdRequest(i * 0.5, (i,), prompt, output) for i in range(200)]

    long_prompts = split("always", stream(16_000, 32), TIMER, 8, 0.05, KV, 64)
    long_answers = split("always", stream(500, 2000), TIMER, 8, 0.05, KV, 64)
    assert long_prompts.prefill + long_prompts.decode == 8
    assert long_prompts.prefill > long_answers.prefill
    assert long_answers.decode > long_prompts.decode
    assert split("colocated", stream(500, 100), TIMER, 8, 0.05, KV, 64) == Pools(0, 0, 8)


def test_a_bad_mode_or_no_request_is_refused() -> None:
    with pytest.raises(ValueError, match="mode: 'pairs' is not allowed; allowed: colocated"):
        split("pairs", [PdRequest(0.0, (), 10, 10)], TIMER, 8, 0.05, KV, 64)
    with pytest.raises(ValueError, match="requests: none"):
        split("always", [], TIMER, 8, 0.05, KV, 64)
