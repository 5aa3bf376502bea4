"""A real SGLang 0.5.23 engine with a small KV pool (1,024 tokens) evicts old prefixes; its
`BlockRemoved` events take them out of the router's index, which keeps holding exactly the
blocks the engine still has.

Its own module: the engine differs from the two of test_router_real_sglang.py. It is the
session's shared small-pool engine (`tests.real_sglang.SMALL_POOL`), the one of
tests/component/differential/test_differential_small_pool.py (no `--enable-cache-report`: this
test reads KV events, not usage), with an empty cache.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import openai
import pytest

from sglang_tpu.tokenizer import Tokenizer
from tests.component.router.real_engine_traffic import (
    EngineEventFeed,
    engine_tokenizer,
    router_in_front_of,
    text_of_tokens,
)
from tests.component.router.router_fleet import sample
from tests.real_sglang import SMALL_POOL, EnginePool, RealEngine
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

POOL_TOKENS = SMALL_POOL.max_total_tokens
PROMPT_TOKENS = 200
PROMPTS = 8  # ~1,700 tokens with their outputs: the first ones must be evicted
INDEX_SECONDS = 30.0


@pytest.fixture(scope="module")
def small_engine(real_engine_pool: EnginePool) -> RealEngine:
    return real_engine_pool.engine(SMALL_POOL, name="small-pool")


@pytest.fixture
async def router(small_engine: RealEngine) -> AsyncIterator[RouterApp]:
    app = await router_in_front_of([small_engine])
    yield app
    await app.stop()


async def test_evicted_blocks_leave_the_index(router: RouterApp, small_engine: RealEngine) -> None:
    index = router.block_index
    assert index is not None
    worker = small_engine.url
    tokenizer: Tokenizer = engine_tokenizer(small_engine)
    rng = random.Random(11)
    prompts = [text_of_tokens(tokenizer, rng, PROMPT_TOKENS) for _ in range(PROMPTS)]

    def pages_held(text: str) -> tuple[int, int]:
        keys = index.keys(tokenizer.encode(text))
        return index.match(keys, [worker])[0], len(keys)

    async with (
        EngineEventFeed(small_engine) as feed,
        openai.AsyncOpenAI(
            base_url=f"{router.base_url}/v1", api_key="unused", max_retries=0, timeout=120
        ) as client,
    ):
        await feed.synchronise()
        # The shared engine's earlier evictions, which the router counted from its catch-up replay.
        removed_before = sample(
            router, "tpuserve_router_kv_events_total", {"worker": worker, "type": "BlockRemoved"}
        )
        for prompt in prompts:
            await client.completions.create(model=small_engine.model, prompt=prompt, max_tokens=8)
        await eventually_async(
            lambda: "BlockRemoved" in feed.kinds(),
            what="the engine to evict blocks (BlockRemoved)",
            timeout_seconds=INDEX_SECONDS,
            context=small_engine.log_tail,
        )
        await eventually_async(
            lambda: feed.held() and index.engine_hashes(worker) == feed.held(),
            what="the router's index to hold exactly the blocks the engine still holds",
            timeout_seconds=INDEX_SECONDS,
            context=lambda: f"index {len(index.engine_hashes(worker))}, engine {len(feed.held())}",
        )
    removed_events = (
        sample(
            router, "tpuserve_router_kv_events_total", {"worker": worker, "type": "BlockRemoved"}
        )
        - removed_before
    )
    removed_blocks = sum(
        len(e.block_hashes) for e in feed.events if type(e).__name__ == "BlockRemoved"
    )
    first_held, first_pages = pages_held(prompts[0])
    last_held, last_pages = pages_held(prompts[-1])
    print(
        f"\nMEASURED eviction in a {POOL_TOKENS}-token pool: {removed_events:g} BlockRemoved "
        f"events ({removed_blocks} blocks), {len(feed.held())} blocks held; in the index: first "
        f"prompt {first_held}/{first_pages} pages, last {last_held}/{last_pages}"
    )
    assert removed_events == feed.kinds().count("BlockRemoved")
    assert first_held < first_pages, "the oldest prompt was evicted, and left the index"
    assert last_held == last_pages, "the newest prompt is still cached, and in the index"
    assert len(feed.held()) * small_engine.page_size <= POOL_TOKENS
