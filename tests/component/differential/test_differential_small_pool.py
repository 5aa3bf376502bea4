"""The engine twin and real SGLang 0.5.23 alike without `--enable-cache-report` and with a KV
pool of 1,024 tokens: OpenAI usage carries no cached tokens (SGLang's default) while
`/generate` still reports them, and a pool too small for three prompts evicts the least
recently used one with the same `BlockRemoved` events.

One real engine and one twin configured alike, as in test_differential_twin.py. The real
engine is the session's shared small-pool engine (`tests.real_sglang.SMALL_POOL`), which
tests/component/router/test_router_real_sglang_eviction.py uses too; it comes with an empty
cache.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.component.differential import kv_tap
from tests.component.differential.engine_pair import (
    GREEDY,
    EnginePair,
    assert_alike,
    ids,
    twin_like,
)
from tests.real_sglang import SMALL_POOL, EnginePool

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

PROMPT_PAGES = 25  # 400 tokens: two prompts fit the pool, a third evicts the first


@pytest.fixture(scope="module")
def pair(real_engine_pool: EnginePool) -> Iterator[EnginePair]:
    real = real_engine_pool.engine(SMALL_POOL, name="small-pool")
    with twin_like(real, enable_cache_report=False) as twin:
        yield EnginePair(real, twin)


def test_without_cache_report_usage_has_no_cached_tokens_alike(pair: EnginePair) -> None:
    page = pair.real.page_size
    prompt = ids(200, 3 * page + 5)
    completions = {"model": pair.real.model, "prompt": prompt, "max_tokens": 2, **GREEDY}
    streamed = {**completions, "stream": True, "stream_options": {"include_usage": True}}
    chat = {"model": pair.real.model, "max_tokens": 2, **GREEDY,
            "messages": [{"role": "user", "content": "Cache me if you can. " * 8}]}  # fmt: skip
    for path, body in (("/v1/completions", completions), ("/v1/completions", streamed),
                       ("/v1/chat/completions", chat)):  # fmt: skip
        for _ in range(2):  # the second is a cache hit, and still no cached tokens
            real, twin = pair.post(path, body)
            assert_alike(real, twin)
        usage = real.body["usage"] if real.chunks is None else real.data_chunks[-1]["usage"]
        assert usage.get("prompt_tokens_details") is None, usage
    native = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, **GREEDY}}
    real, twin = pair.post("/generate", native)
    assert_alike(real, twin)
    assert real.body["meta_info"]["cached_tokens"] == 3 * page  # /generate always reports


def test_eviction_removes_the_same_blocks(pair: EnginePair) -> None:
    page, topic = pair.real.page_size, pair.real.kv_topic
    prompts: list[kv_tap.Prompt] = [(ids(100 + 500 * i, PROMPT_PAGES * page), 1) for i in range(3)]
    real, twin = (kv_tap.record(url, topic, prompts) for url in (pair.real.url, pair.twin.url))
    found = kv_tap.differences(real, twin, topic, page)
    assert not found, "\n".join(found)
    removed = {
        name
        for kind, fields in kv_tap.named_events(real, page)
        if kind == "BlockRemoved"
        for name in fields["block_hashes"]
    }
    assert removed, "the third prompt evicted nothing: the comparison saw no BlockRemoved"
    assert removed <= {f"r0p{k}" for k in range(PROMPT_PAGES)}  # the least recently used
