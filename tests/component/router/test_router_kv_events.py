"""precise routing on the engines' KV events: hits follow the events, and after a flush or an
engine restart no request is routed on stale entries once the event arrives; what the router
cannot read is counted, logged once and skipped, and the stream goes on. Lost events:
`test_router_kv_event_gaps`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import aiohttp
import msgpack
import pytest

from sglang_tpu.kv_events import (
    MEDIUM_HOST,
    BlockStored,
    EventBatch,
    block_hashes,
    encode_batch,
    page_stores,
)
from sglang_tpu.tokenizer import load_tokenizer
from tests.component.router.kv_publisher import (
    PAGE,
    PROMPT,
    blocks_of,
    complete,
    decisions,
    events,
    publishing_router,
    removed,
    resyncs,
    stored,
    wait_blocks,
)
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    sample,
    start_engines,
    start_router,
    wait_caught_up,
    wait_ready,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.metrics import KV_EVENT_SKIP_REASONS

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def kv_engines() -> Iterator[list[EngineTwin]]:
    fleet = start_engines(2, ["--time-scale", "0", "--page-size", str(PAGE)])
    yield fleet
    for engine in fleet:
        engine.stop()


@pytest.fixture
async def precise(kv_engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    for engine in kv_engines:
        if engine.proc is None or engine.proc.poll() is not None:
            engine.start()
    app = await start_router(
        RouterConfig(
            workers=tuple(e.url for e in kv_engines),
            policy="precise",  # kv_events left unset: precise subscribes by itself
            health_check_interval_seconds=0.3,
            health_failure_threshold=1,
            policy_params={"predicted_ttl_seconds": "0.2"},
        )
    )
    await wait_ready(app, len(kv_engines))
    await wait_caught_up(app, [e.url for e in kv_engines])
    yield app
    await app.stop()


def held(app: RouterApp, prompt: str) -> dict[str, int]:
    """Leading blocks of ``prompt`` each worker holds, as the router's index sees it."""
    assert app.block_index is not None
    index = app.block_index
    names = [w.name for w in app.registry.workers]
    depths = index.match(index.keys(load_tokenizer().encode(prompt)), names)
    return {n: d for n, d in zip(names, depths, strict=True) if d}


def holder(app: RouterApp, prompt: str) -> str:
    holders = held(app, prompt)
    assert len(holders) == 1, holders
    return next(iter(holders))


async def wait_until_predictions_expire(app: RouterApp) -> None:
    assert app.block_index is not None
    index = app.block_index
    await eventually_async(
        lambda: index.match([0], []) == [] and index.predicted_blocks == 0,
        what="routing predictions to expire",
        timeout_seconds=5,
    )


async def warm(app: RouterApp, prompt: str) -> str:
    """Route ``prompt`` once and wait until the engine's events say who holds it."""
    assert await complete(app, prompt) == 0
    await wait_until_predictions_expire(app)
    await eventually_async(lambda: held(app, prompt), what="BlockStored events", timeout_seconds=30)
    return holder(app, prompt)


async def test_requests_follow_the_blocks_the_engines_report(precise: RouterApp) -> None:
    prompt = "follow: " + PROMPT
    worker = await warm(precise, prompt)
    hits = decisions(precise, "prefix_hit")
    cached = await complete(precise, prompt + "second")
    assert decisions(precise, "prefix_hit") == hits + 1
    assert cached >= len(load_tokenizer().encode(prompt)) // PAGE * PAGE - PAGE
    predicted = sample(precise, "tpuserve_router_predicted_cached_tokens_total",
                       {"model": MODEL, "worker": worker})  # fmt: skip
    actual = sample(precise, "tpuserve_router_cached_tokens_total",
                    {"model": MODEL, "worker": worker})  # fmt: skip
    assert predicted == actual


async def test_after_a_flush_event_nothing_routes_on_the_old_blocks(precise: RouterApp) -> None:
    prompt = "flush: " + PROMPT
    worker = await warm(precise, prompt)
    # Counted from here: an engine's first batch clears every block too (SGLang's radix cache
    # resets when it is built), and the router may have caught it live or by replay.
    cleared, resynced = (
        events(precise, worker, "AllBlocksCleared"),
        resyncs(precise, worker, "all_blocks_cleared"),
    )
    async with (  # flushed behind the router's back
        aiohttp.ClientSession() as session,
        session.post(worker + "/flush_cache") as response,
    ):
        assert response.status == 200
    await eventually_async(
        lambda: events(precise, worker, "AllBlocksCleared") == cleared + 1,
        what="the flush event",
        timeout_seconds=5,
    )
    await wait_until_predictions_expire(precise)
    assert precise.block_index is not None
    assert precise.block_index.worker_blocks(worker) == 0
    misses = decisions(precise, "miss")
    assert await complete(precise, prompt) == 0
    assert decisions(precise, "miss") == misses + 1
    assert resyncs(precise, worker, "all_blocks_cleared") == resynced + 1


async def test_flush_through_the_router_reaches_every_worker(precise: RouterApp) -> None:
    prompt = "flush all: " + PROMPT
    await warm(precise, prompt)
    async with (
        aiohttp.ClientSession() as session,
        session.post(precise.base_url + "/flush_cache") as response,
    ):
        assert response.status == 200
        body = await response.json()
    assert body["flushed"] is True
    assert sorted(body["workers"]) == sorted(w.name for w in precise.registry.workers)
    assert precise.block_index is not None
    assert precise.block_index.confirmed_blocks == 0
    await wait_until_predictions_expire(precise)
    assert await complete(precise, prompt) == 0


async def test_after_an_engine_restart_nothing_routes_on_the_old_blocks(
    precise: RouterApp, kv_engines: list[EngineTwin]
) -> None:
    prompt = "restart: " + PROMPT
    worker = await warm(precise, prompt)
    engine = next(e for e in kv_engines if e.url == worker)
    engine.kill()
    engine.start()  # same HTTP and KV ports, empty cache, sequence numbers from 0
    async with aiohttp.ClientSession() as session:  # traffic the router does not see
        body = {"text": "unrelated warm-up text " * 10, "sampling_params": {"max_new_tokens": 1}}
        async with session.post(engine.url + "/generate", json=body) as response:
            assert response.status == 200
    await eventually_async(
        lambda: resyncs(precise, worker, "engine_restart", "publisher_disconnected"),
        what="the restart to be noticed",
        timeout_seconds=10,
    )
    await wait_until_predictions_expire(precise)
    await eventually_async(
        lambda: all(w.healthy for w in precise.registry.workers),
        what="re-admission",
        timeout_seconds=30,
    )
    assert held(precise, prompt) == {}
    misses = decisions(precise, "miss")
    assert await complete(precise, prompt) == 0
    assert decisions(precise, "miss") == misses + 1


# ---------------------------------------------------------------- what the router cannot read


def skipped(app: RouterApp, worker: str, reason: str) -> float:
    labels = {"worker": worker, "reason": reason}
    return sample(app, "tpuserve_router_kv_events_skipped_total", labels)


async def test_malformed_and_unknown_events_are_counted_logged_once_and_skipped(
    plain_engine: EngineTwin, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = load_tokenizer().encode(PROMPT)
    hashes = block_hashes(tokens, PAGE)
    pages = len(hashes)
    unknown = {"type": "BlockPinned", "block_hashes": [1]}  # a type from a newer engine
    unhashable = BlockStored([5], None, [[1, 2]] * PAGE, PAGE)  # type: ignore[list-item]
    async with publishing_router(plain_engine, replay=False) as (app, publisher, worker):
        await publisher.publish(0, stored(tokens))
        last = ["BlockRemoved", [hashes[-1]]]  # the rest of a batch still counts
        await publisher.publish(1, msgpack.packb([0.0, [unknown, last], 0]))
        await publisher.publish(2, b"\xc1not msgpack")
        await publisher.pub.send_multipart([b"", b"no sequence frame"])
        await publisher.publish(3, msgpack.packb([0.0, [unknown, {"type": "BlockStored"}], 0]))
        await publisher.publish(4, encode_batch(EventBatch(0.0, [unhashable])))
        await publisher.publish(5, removed(tokens, slice(pages - 2, pages - 1)))
        await wait_blocks(app, worker, pages - 2, "the last batch")
        counts = {r: skipped(app, worker, r) for r in KV_EVENT_SKIP_REASONS}
        assert counts == {"bad_frames": 1, "undecodable_batch": 1, "malformed_event": 2,
                          "unknown_event": 2}  # fmt: skip
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        for reason in KV_EVENT_SKIP_REASONS:  # once per worker and reason
            assert sum(f"({reason})" in m for m in warned) == 1, (reason, warned)
        assert resyncs(app, worker, "gap_unrecoverable") == 0


async def test_each_workers_streams_are_bounded_by_its_pool(
    precise: RouterApp, kv_engines: list[EngineTwin]
) -> None:
    """Issue 57 item 7: at admission the router reads each worker's pool from /server_info
    (max_total_num_tokens / page_size): no stream of it is believed past that many blocks."""
    index = precise.block_index
    assert index is not None
    async with aiohttp.ClientSession() as session:
        for engine in kv_engines:
            async with session.get(engine.url + "/server_info") as answer:
                info = await answer.json()
            pages = -(-info["max_total_num_tokens"] // info["page_size"])
            assert info["page_size"] == PAGE
            assert 0 < pages < index.max_stream_blocks  # the pool's, not the cap
            assert index.worker_limit(engine.url) == pages


async def test_a_host_tagged_flood_is_held_to_a_multiple_of_the_workers_pool() -> None:
    """Issue 68: one event tagged as host memory lifted a stream's bound from its worker's
    pool to 1,048,576 blocks, and a worker added with its KV-event endpoint given had no pool
    bound at all. Over real ZMQ, 1,000 host-tagged pages from the stream of a worker whose
    /server_info says 16 pages: the router believes 16 x 16 of them, the rest dropped."""
    engine = EngineTwin(
        ["--time-scale", "0", "--page-size", str(PAGE), "--cache-tokens", str(16 * PAGE)],
        kv_events=False,
    )
    engine.start()
    try:
        async with publishing_router(engine, replay=False) as (app, publisher, name):
            index = app.block_index
            assert index is not None
            await eventually_async(
                lambda: index.worker_limit(name) == 16, what="the pool read from /server_info"
            )
            tokens = list(range(1000 * PAGE))
            flood = encode_batch(EventBatch(0.0, [*page_stores(tokens, PAGE, MEDIUM_HOST)]))
            await publisher.publish(0, flood)
            await eventually_async(
                lambda: index.dropped_blocks >= 1000 - 16 * 16, what="the flood read"
            )
            assert blocks_of(app, name) == 16 * 16  # before: all 1,000 (up to 1,048,576)
    finally:
        engine.stop()
