"""precise routing by tier, on real ZMQ from engine twins with SGLang's host KV tier: a prefix
an engine holds only in host memory (demoted out of its HBM) is routed to that engine, and its
tokens come back as cached (docs/host-kv-tier.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    requests_by_worker,
    sample,
    start_engines,
    start_router,
    wait_caught_up,
    wait_ready,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

PAGE = 16
CACHE_TOKENS = 2048  # a small HBM pool: a few prompts push one out to host memory
PROMPT = "A conversation kept in host memory after HBM let it go, many pages long. " * 14


@pytest.fixture(scope="module")
def tiered_engines() -> Iterator[list[EngineTwin]]:
    args = ["--time-scale", "0", "--page-size", str(PAGE), "--cache-tokens", str(CACHE_TOKENS)]
    fleet = start_engines(2, [*args, "--enable-hierarchical-cache", "--hicache-ratio", "8"])
    yield fleet
    for engine in fleet:
        engine.stop()


@pytest.fixture
async def precise(tiered_engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    app = await start_router(
        RouterConfig(
            workers=tuple(e.url for e in tiered_engines),
            policy="precise",
            health_check_interval_seconds=0.3,
            policy_params={"predicted_ttl_seconds": "0.2", "host_hit_weight": "0.5"},
        )
    )
    await wait_ready(app, len(tiered_engines))
    await wait_caught_up(app, [e.url for e in tiered_engines])
    yield app
    await app.stop()


async def complete(base_url: str, prompt: str) -> int:
    """One completion; the cached prompt tokens the engine reported."""
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x") as client:
        result = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert result.usage is not None
    details = result.usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details else 0


async def test_a_prefix_held_only_in_host_memory_is_routed_to_that_engine(
    precise: RouterApp, tiered_engines: list[EngineTwin]
) -> None:
    holder = tiered_engines[1].url  # listed second: a miss would go to the first
    assert precise.block_index is not None
    index = precise.block_index
    tokens = load_tokenizer().encode(PROMPT)
    blocks = (len(tokens) - 1) // PAGE
    keys = index.keys(tokens)
    assert await complete(holder, PROMPT) == 0  # behind the router's back
    await eventually_async(
        lambda: index.device_match(keys, [holder]) == [blocks],
        what="the prompt's BlockStored GPU events",
        timeout_seconds=30,
    )
    for i in range(6):  # more than the HBM pool holds: the prompt is demoted to host memory
        assert await complete(holder, f"filler {i}: " + "unrelated words " * 150) == 0
    await eventually_async(
        lambda: (
            index.device_match(keys, [holder]) == [0] and index.match(keys, [holder]) == [blocks]
        ),
        what="the demotion: BlockRemoved GPU, the CPU_PINNED copy kept",
        timeout_seconds=30,
    )
    assert index.host_only_blocks >= blocks
    before = requests_by_worker(precise).get(holder, 0.0)
    hits = sample(precise, "tpuserve_router_routing_decisions_total",
                  {"policy": "precise", "outcome": "prefix_hit"})  # fmt: skip
    cached = await complete(precise.base_url, PROMPT)
    assert requests_by_worker(precise).get(holder, 0.0) == before + 1
    assert cached == blocks * PAGE  # loaded back from host memory, not computed again
    assert sample(precise, "tpuserve_router_routing_decisions_total",
                  {"policy": "precise", "outcome": "prefix_hit"}) == hits + 1  # fmt: skip
    host = sample(precise, "tpuserve_router_predicted_cached_tokens_by_tier_total",
                  {"policy": "precise", "tier": "host"})  # fmt: skip
    assert host == blocks * PAGE
