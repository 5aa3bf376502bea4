"""precise routing on the engines' KV events: hits follow the events, and after a flush, an
engine restart or lost events, no request is routed on stale entries once the event arrives;
what the router cannot read is counted, logged once and skipped, and the stream goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import openai
import pytest
import zmq
import zmq.asyncio

from sglang_tpu.kv_events import (
    END_SEQ_BYTES,
    MEDIUM_HOST,
    BlockRemoved,
    BlockStored,
    EventBatch,
    block_hashes,
    encode_batch,
    page_stores,
    pub_frames,
)
from sglang_tpu.tokenizer import load_tokenizer
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
from tpuserve_router.kv import kv_events, kv_replay
from tpuserve_router.kv.kv_events import RECEIVE_HIGH_WATER_MARK
from tpuserve_router.kv.kv_replay import DRAIN_MAX_MESSAGES
from tpuserve_router.metrics import KV_EVENT_SKIP_REASONS
from tpuserve_router.peering.kv_snapshot import SNAPSHOT_FORMAT

pytestmark = pytest.mark.component

PAGE = 16
PROMPT = "Shared context for precise routing tests, long enough for many pages. " * 12


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


def decisions(app: RouterApp, outcome: str) -> float:
    labels = {"policy": "precise", "outcome": outcome}
    return sample(app, "tpuserve_router_routing_decisions_total", labels)


def resyncs(app: RouterApp, worker: str, *reasons: str) -> float:
    name = "tpuserve_router_kv_event_resyncs_total"
    return sum(sample(app, name, {"worker": worker, "reason": r}) for r in reasons)


def events(app: RouterApp, worker: str, kind: str) -> float:
    return sample(app, "tpuserve_router_kv_events_total", {"worker": worker, "type": kind})


async def complete(app: RouterApp, prompt: str) -> int:
    """Send a completion; returns the cached tokens the engine reported."""
    async with openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="x") as oa:
        result = await oa.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert result.usage is not None
    details = result.usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details else 0


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


# ---------------------------------------------------------------- lost events


class Publisher:
    """An engine's publishing side on real ZMQ sockets that can lose batches on demand:
    XPUB (to know when the router has subscribed) and an optional replay ROUTER that, like
    the engine's, holds every batch published, delivered or not. Its replay requests are
    counted (``asked``); the first ``unanswered`` get no answer (an engine too busy: the
    router's replay times out), and while ``stalled`` is set none is answered yet."""

    def __init__(
        self, replay: bool, bind: str = "tcp://127.0.0.1:*", replay_send_queue: int = 1000
    ) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.bind(bind)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay: dict[int, bytes] = {}
        self.router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.asked = 0
        self.unanswered = 0
        self.stalled: asyncio.Event | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.SNDHWM, replay_send_queue)  # ZMQ's default, as SGLang's
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self.task = asyncio.ensure_future(self._serve_replay())

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            identity, _, start = await self.router.recv_multipart()
            self.asked += 1
            if self.asked <= self.unanswered:
                continue
            if self.stalled is not None:
                await self.stalled.wait()
            first = int.from_bytes(start, "big")
            for seq in sorted(s for s in self.replay if s >= first):
                await self.router.send_multipart(
                    [identity, b"", seq.to_bytes(8, "big"), self.replay[seq]]
                )
            await self.router.send_multipart([identity, b"", END_SEQ_BYTES, b""])

    async def wait_subscribed(self) -> None:
        assert await self.pub.poll(10_000), "the router never subscribed"
        await self.pub.recv()

    async def publish(self, seq: int, payload: bytes, *, lost: bool = False) -> None:
        self.replay[seq] = payload
        if not lost:
            await self.pub.send_multipart(pub_frames(b"", seq, payload))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.ctx.destroy(linger=0)


def stored(tokens: list[int]) -> bytes:
    """The BlockStored events an engine sends when it caches ``tokens``, page by page."""
    return encode_batch(EventBatch(0.0, [*page_stores(tokens, PAGE)]))


def removed(tokens: list[int], pages: slice) -> bytes:
    hashes = block_hashes(tokens, PAGE)[pages]
    return encode_batch(EventBatch(0.0, [BlockRemoved(hashes)]))


@contextlib.asynccontextmanager
async def publishing_router(
    engine: EngineTwin,
    *,
    replay: bool,
    publisher: Publisher | None = None,
    snapshot: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[RouterApp, Publisher, str]]:
    """A precise router whose one worker, `engine`, has its KV events from a `Publisher` (a
    new one unless given), seeded with a peer's ``snapshot`` if given: the router, the
    publisher and the worker's name; both stopped on the way out."""
    publisher = publisher or Publisher(replay=replay)
    config = RouterConfig(
        policy="precise", kv_events=True, policy_params={"predicted_ttl_seconds": "0"}
    )
    app = await start_router(config)
    if snapshot is not None:
        assert app.seeds is not None
        app.seeds.take(snapshot)
    try:
        async with aiohttp.ClientSession() as session:
            body = {"url": engine.url, "kv_events_endpoint": publisher.endpoint,
                    "kv_replay_endpoint": publisher.replay_endpoint}  # fmt: skip
            async with session.post(app.base_url + "/workers", json=body) as response:
                assert response.status == 200
                name = (await response.json())["worker"]["url"]
        await wait_ready(app, 1)
        await publisher.wait_subscribed()
        yield app, publisher, name
    finally:
        await app.stop()
        await publisher.close()


def blocks_of(app: RouterApp, worker: str) -> int:
    """Blocks the router's index holds for `worker`."""
    assert app.block_index is not None
    return app.block_index.worker_blocks(worker)


async def wait_blocks(app: RouterApp, worker: str, blocks: int, what: str) -> None:
    await eventually_async(lambda: blocks_of(app, worker) == blocks, what=what, timeout_seconds=5)


@pytest.fixture(scope="module")
def plain_engine() -> Iterator[EngineTwin]:
    # a pool of 131,072 pages: the stream of a worker added with its endpoint is bounded by
    # it too (issue 68), and the longest replay here is 80,000 pages
    engine = EngineTwin(
        ["--time-scale", "0", "--page-size", str(PAGE), "--cache-tokens", str(PAGE << 17)],
        kv_events=False,
    )
    engine.start()
    yield engine
    engine.stop()


async def test_an_unrecoverable_gap_drops_the_workers_entries(plain_engine: EngineTwin) -> None:
    tokens = load_tokenizer().encode(PROMPT)
    async with publishing_router(plain_engine, replay=False) as (app, publisher, worker):
        await publisher.publish(0, stored(tokens))
        await wait_blocks(app, worker, len(tokens) // PAGE, "events")
        hits = decisions(app, "prefix_hit")
        await complete(app, PROMPT)
        assert decisions(app, "prefix_hit") == hits + 1
        await publisher.publish(1, stored(tokens), lost=True)
        await publisher.publish(2, stored(tokens), lost=True)
        await publisher.publish(3, stored(tokens[:PAGE]))
        await eventually_async(
            lambda: resyncs(app, worker, "gap_unrecoverable") == 1, what="resync", timeout_seconds=5
        )
        assert sample(app, "tpuserve_router_kv_event_gaps_total", {"worker": worker}) == 1
        assert blocks_of(app, worker) == 1  # only what came after the gap
        misses = decisions(app, "miss")
        await complete(app, PROMPT)
        assert decisions(app, "miss") == misses + 1


async def test_a_gap_the_engine_can_replay_is_filled(plain_engine: EngineTwin) -> None:
    tokens = load_tokenizer().encode(PROMPT)
    pages = len(tokens) // PAGE
    async with publishing_router(plain_engine, replay=True) as (app, publisher, worker):
        await publisher.publish(0, stored(tokens))
        await wait_blocks(app, worker, pages, "events")
        await publisher.publish(1, removed(tokens, slice(pages - 2, None)), lost=True)
        await publisher.publish(2, encode_batch(EventBatch(0.0, [])), lost=True)
        await publisher.publish(3, encode_batch(EventBatch(0.0, [])))
        # the removal in a lost batch is applied through the replay
        await wait_blocks(app, worker, pages - 2, "the replay")
        assert sample(app, "tpuserve_router_kv_event_gaps_total", {"worker": worker}) == 1
        assert resyncs(app, worker, "gap_unrecoverable") == 0


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
async def test_a_burst_longer_than_one_read_is_applied_in_order(
    plain_engine: EngineTwin, transport: str, tmp_path: Path
) -> None:
    # The stream is read without awaiting, a bounded number of messages per turn: what is
    # left must still be read (a descriptor will not signal it again), and in order; by the
    # ZMTP reader (tcp://) and by libzmq's SUB socket (ipc://) alike.
    tokens = load_tokenizer().encode(PROMPT)
    pages = len(tokens) // PAGE
    burst = 3 * DRAIN_MAX_MESSAGES + 5
    bind = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{tmp_path}/kv"
    publisher = Publisher(replay=False, bind=bind)
    async with publishing_router(plain_engine, replay=False, publisher=publisher) as (
        app,
        publisher,
        worker,
    ):
        assert app.kv is not None
        (stream,) = app.kv.subscriptions(worker)
        assert (stream.subscriber is not None) == (transport == "tcp")
        for seq in range(burst - 1):  # stored and removed in turn, so order matters
            payload = stored(tokens) if seq % 2 == 0 else removed(tokens, slice(1, None))
            await publisher.publish(seq, payload)
        await publisher.publish(burst - 1, stored(tokens))
        await eventually_async(
            lambda: events(app, worker, "BlockStored") == (burst + 1) // 2 * pages,
            what="every batch",
            timeout_seconds=10,
        )
        assert blocks_of(app, worker) == pages
        assert sample(app, "tpuserve_router_kv_event_gaps_total", {"worker": worker}) == 0


@pytest.mark.parametrize("restarted", [False, True])
async def test_a_seeded_stream_whose_engine_restarted_drops_the_snapshots_blocks(
    plain_engine: EngineTwin, restarted: bool
) -> None:
    # A peer saw batches 0..40; an engine that restarted since (and stayed idle) no longer
    # holds batch 40: the peer's blocks are stale. One that did not restart still holds it.
    tokens = load_tokenizer().encode(PROMPT)
    pages = len(tokens) // PAGE
    publisher = Publisher(replay=True)
    seq = 41
    if not restarted:
        await publisher.publish(seq - 1, stored(tokens), lost=True)  # in its buffer only
    blocks = [[h, None] for h in block_hashes(tokens, PAGE)[:pages]]
    stream = {"worker": plain_engine.url, "rank": 0, "events": publisher.endpoint,
              "seq": seq, "blocks": blocks}  # fmt: skip
    snapshot = {"format": SNAPSHOT_FORMAT, "page_size": PAGE, "streams": [stream]}
    async with publishing_router(
        plain_engine, replay=True, publisher=publisher, snapshot=snapshot
    ) as (app, _publisher, worker):
        replays = {"worker": worker, "result": "ok"}
        await eventually_async(
            lambda: sample(app, "tpuserve_router_kv_event_replays_total", replays) >= 1,
            what="the catch-up replay",
            timeout_seconds=5,
        )
        if restarted:
            await wait_blocks(app, worker, 0, "the stale blocks dropped")
            assert resyncs(app, worker, "engine_restart") == 1
        else:
            assert blocks_of(app, worker) == pages
            assert resyncs(app, worker, "engine_restart") == 0


def distinct_pages(first: int, pages: int) -> bytes:
    """A batch storing ``pages`` pages no other batch of a test stores (from page ``first``)."""
    return stored(list(range(first * PAGE, (first + pages) * PAGE)))


async def test_a_catch_up_longer_than_zmqs_default_queues_arrives_whole(
    plain_engine: EngineTwin,
) -> None:
    # SGLang keeps 10,000 batches for replay and sends them from a ROUTER socket, which drops
    # what the reader's queue cannot take (ZMQ's default mark: 1,000 messages) and may drop
    # the end marker too. The router must take the whole replay, not a part of it, or fail.
    # The publisher's own send queue is made large enough here: with ZMQ's default (1,000, as
    # SGLang's) it drops part of a replay whenever its loop sends faster than its I/O thread
    # writes, which a loaded machine makes likely and which no router can prevent (a router
    # that knows nothing then asks again: test_a_failed_catch_up_is_asked_again...). The
    # router's own queue is checked against SGLang's publisher, with the router's loop
    # blocked, in test_router_kv_wire.py.
    batches, pages = 10_000, 8
    publisher = Publisher(replay=True, replay_send_queue=batches + 1)
    for seq in range(batches):
        publisher.replay[seq] = distinct_pages(seq * pages, pages)  # in its buffer only
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await wait_blocks(app, worker, batches * pages, "the whole replay")
        replays = "tpuserve_router_kv_event_replays_total"
        assert sample(app, replays, {"worker": worker, "result": "ok"}) == 1


async def test_a_stream_whose_catch_up_failed_learns_the_buffer_at_its_next_batch(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The catch-up at connect failed (the engine did not answer in time); the next batch
    # must bring what the engine's buffer holds before it, also when the buffer no longer
    # starts at batch 0 (it wrapped): asking for batches 0.. would fail again, every time.
    monkeypatch.setattr(kv_replay, "REPLAY_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(kv_events, "CATCH_UP_RETRY_SECONDS", ())  # only the batch asks again
    publisher = Publisher(replay=True)
    publisher.unanswered = 1
    for seq in range(100, 200):  # 0..99 are gone from its buffer
        publisher.replay[seq] = distinct_pages(seq, 1)
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        replays = "tpuserve_router_kv_event_replays_total"
        await eventually_async(
            lambda: sample(app, replays, {"worker": worker, "result": "failed"}) == 1,
            what="the failed catch-up", timeout_seconds=5,
        )  # fmt: skip
        await publisher.publish(200, distinct_pages(200, 1))
        await wait_blocks(app, worker, 101, "the buffer's batches and the new one")
        assert publisher.asked == 2


async def test_a_failed_catch_up_is_asked_again_while_the_engine_is_idle(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An idle engine sends no batch that would make the router catch up after a failed
    # replay; the router asks again by itself, a bounded number of times.
    monkeypatch.setattr(kv_replay, "REPLAY_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(kv_events, "CATCH_UP_RETRY_SECONDS", (0.05, 0.05, 0.05))
    publisher = Publisher(replay=True)
    publisher.unanswered = 1
    for seq in range(50):
        publisher.replay[seq] = distinct_pages(seq, 1)
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await wait_blocks(app, worker, 50, "the buffer, on the second try")
        assert publisher.asked == 2
        replays = "tpuserve_router_kv_event_replays_total"
        assert sample(app, replays, {"worker": worker, "result": "failed"}) == 1
        assert sample(app, replays, {"worker": worker, "result": "ok"}) == 1

    publisher = Publisher(replay=True)  # never answers: asked at connect and 3 times more
    publisher.unanswered = 100
    publisher.replay[0] = distinct_pages(0, 1)
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await eventually_async(lambda: publisher.asked == 4, what="the retries", timeout_seconds=5)
        await asyncio.sleep(0.5)  # past a replay's timeout and a retry's wait
        assert publisher.asked == 4
        assert blocks_of(app, worker) == 0


class OverflowingPublisher(Publisher):
    """A publisher whose replay socket overflows as an engine's ROUTER socket does when its
    loop sends faster than its I/O thread writes: of each answer the first ``queue`` batches
    get through, the next ``lost`` are dropped, the rest get through, and the end marker is
    dropped too whenever anything was. Its replay requests are counted (``asked``)."""

    queue = 10
    lost = 5

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            identity, _, start = await self.router.recv_multipart()
            self.asked += 1
            first = int.from_bytes(start, "big")
            sent = 0
            dropped = False
            for seq in sorted(s for s in self.replay if s >= first):
                sent += 1
                if self.queue < sent <= self.queue + self.lost:
                    dropped = True
                    continue
                await self.router.send_multipart(
                    [identity, b"", seq.to_bytes(8, "big"), self.replay[seq]]
                )
            if not dropped:
                await self.router.send_multipart([identity, b"", END_SEQ_BYTES, b""])


async def test_a_replay_that_loses_batches_on_the_way_is_asked_again_from_the_first_missing(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every answer loses batches in the middle and its end marker: the router applies the
    # run before the first hole and asks again from there, keeping what it applied, until
    # the whole buffer is in, the removal in a batch lost from the first answer included.
    monkeypatch.setattr(kv_replay, "REPLAY_TIMEOUT_SECONDS", 0.3)
    publisher = OverflowingPublisher(replay=True)
    for seq in range(50):
        publisher.replay[seq] = distinct_pages(seq, 1)
    publisher.replay[12] = removed(list(range(2 * PAGE, 3 * PAGE)), slice(None))
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await wait_blocks(app, worker, 48, "batches 0..49, page 2 removed in 12")
        replays = "tpuserve_router_kv_event_replays_total"
        await eventually_async(
            lambda: sample(app, replays, {"worker": worker, "result": "ok"}) == 1,
            what="one catch-up, whole", timeout_seconds=5,
        )  # fmt: skip
        assert sample(app, replays, {"worker": worker, "result": "failed"}) == 0
        assert sample(app, "tpuserve_router_kv_event_resyncs_total",
                      {"worker": worker, "reason": "gap_unrecoverable"}) == 0  # fmt: skip
        assert publisher.asked >= 5  # 0.., 10.., 20.., 30.., 40..: one round per hole
        assert sample(app, "tpuserve_router_kv_event_lag_batches", {"worker": worker}) == 0
        await publisher.publish(50, distinct_pages(50, 1))
        await wait_blocks(app, worker, 49, "the next batch, in sequence")
        assert sample(app, "tpuserve_router_kv_event_gaps_total", {"worker": worker}) == 0


class DroppingPublisher(Publisher):
    """A publisher whose replay socket always loses batches ``lost`` and the end marker."""

    lost = range(10, 20)

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            identity, _, start = await self.router.recv_multipart()
            self.asked += 1
            first = int.from_bytes(start, "big")
            for seq in sorted(s for s in self.replay if s >= first and s not in self.lost):
                await self.router.send_multipart(
                    [identity, b"", seq.to_bytes(8, "big"), self.replay[seq]]
                )


async def test_batches_an_engine_never_replays_are_dropped_and_what_follows_is_applied(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Asked again from batch 10, the engine answers from 20: it no longer holds 10..19, so
    # the stream drops what it knew (0..9, applied first) and takes 20..49; what it lacks at
    # the end (nothing answers past 49) shows as lag and is asked again, a bounded number of
    # times, and the next live batch carries on in sequence.
    monkeypatch.setattr(kv_replay, "REPLAY_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setattr(kv_events, "CATCH_UP_RETRY_SECONDS", (0.05,))
    publisher = DroppingPublisher(replay=True)
    for seq in range(50):
        publisher.replay[seq] = distinct_pages(seq, 1)
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await wait_blocks(app, worker, 30, "batches 20..49")
        await eventually_async(
            lambda: resyncs(app, worker, "gap_unrecoverable") == 1,
            what="the unreplayable batches", timeout_seconds=5,
        )  # fmt: skip
        replays = "tpuserve_router_kv_event_replays_total"
        await eventually_async(
            lambda: sample(app, replays, {"worker": worker, "result": "failed"}) == 2,
            what="the catch-up and its one retry, short of an end marker", timeout_seconds=5,
        )  # fmt: skip
        await publisher.publish(50, distinct_pages(50, 1))
        await wait_blocks(app, worker, 31, "the next batch, in sequence")


class LateSubscribingPublisher(Publisher):
    """A publisher that publishes batch 0 right after answering the first replay and before
    it takes the router's subscription into account: the batch reaches its replay buffer
    only, as an engine's does when it publishes in that moment after the handshake."""

    async def _serve_replay(self) -> None:
        assert self.router is not None
        identity, _, _start = await self.router.recv_multipart()
        self.asked += 1
        await self.router.send_multipart([identity, b"", END_SEQ_BYTES, b""])  # empty so far
        await self.publish(0, distinct_pages(0, 2), lost=True)
        await super()._serve_replay()


async def test_a_batch_published_before_the_subscription_took_is_replayed_on_an_idle_engine(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine stays idle after it: no later batch's sequence number shows the gap, so
    # only the router's second look at the replay buffer after connecting finds it.
    monkeypatch.setattr(kv_events, "CONFIRM_AFTER_CONNECT_SECONDS", 0.2)
    publisher = LateSubscribingPublisher(replay=True)
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await wait_blocks(app, worker, 2, "batch 0, from the second look")
        assert publisher.asked == 2
        assert sample(app, "tpuserve_router_kv_event_gaps_total", {"worker": worker}) == 1
        await publisher.publish(1, distinct_pages(2, 1))  # the stream goes on in sequence
        await wait_blocks(app, worker, 3, "batch 1, live")
        assert sample(app, "tpuserve_router_kv_event_gaps_total", {"worker": worker}) == 1


async def test_events_that_come_during_a_catch_up_do_not_spin_the_reader(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While the catch-up replay holds the lock, live events queue; the reader must clear the
    # socket's signal, else the event loop calls it again and again until the lock is free.
    publisher = Publisher(replay=True)
    publisher.stalled = asyncio.Event()  # the catch-up's replay is not answered until set
    tokens = load_tokenizer().encode(PROMPT)
    async with publishing_router(plain_engine, replay=True, publisher=publisher) as (
        app,
        _publisher,
        worker,
    ):
        await eventually_async(lambda: publisher.asked == 1, what="the catch-up's replay")
        assert app.kv is not None
        (stream,) = app.kv.subscriptions(worker)
        assert stream.subscriber is not None
        await publisher.publish(0, stored(tokens))
        before = stream.subscriber.turns
        await asyncio.sleep(0.3)  # a spinning reader is called thousands of times meanwhile
        busy_reads = stream.subscriber.turns - before
        publisher.stalled.set()
        await wait_blocks(app, worker, len(tokens) // PAGE, "the events after the catch-up")
    assert busy_reads < 20


async def test_a_streams_unread_batches_are_bounded(
    plain_engine: EngineTwin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past the mark the router stops reading the connection (the engine's PUB queues, then
    # drops: a sequence gap); without one, a router far behind its engines would hold every
    # batch. Here the stream is kept busy (its lock held) while batches keep coming.
    mark = 8
    assert RECEIVE_HIGH_WATER_MARK > 0
    monkeypatch.setattr(kv_events, "RECEIVE_HIGH_WATER_MARK", mark)
    tokens = load_tokenizer().encode(PROMPT * 8)
    assert len(tokens) >= 6 * mark * PAGE
    async with publishing_router(plain_engine, replay=False) as (app, publisher, worker):
        assert app.kv is not None
        (stream,) = app.kv.subscriptions(worker)
        assert stream.subscriber is not None
        pending = stream.subscriber.pending
        async with stream.lock:
            for seq in range(3 * mark):
                await publisher.publish(seq, stored(tokens[: PAGE * (seq + 1)]))
            await eventually_async(
                lambda: len(pending) >= mark, what="the mark's worth of batches read",
                timeout_seconds=5,
            )  # fmt: skip
            held = len(pending)  # one read may take a little more than the mark
            for seq in range(3 * mark, 6 * mark):
                await publisher.publish(seq, stored(tokens[: PAGE * (seq + 1)]))
            await asyncio.sleep(0.1)  # turns of the reader, which must not read further
            assert len(pending) == held
        await wait_blocks(app, worker, 6 * mark, "the rest read once the stream is free")


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
