"""precise routing when KV events are lost: a gap the engine cannot replay drops the worker's
entries, one it can is filled; bursts, catch-ups longer than ZMQ's queues, failed or lossy
replays and batches never replayed all end with the index the engine's events describe, and a
stream's unread batches stay bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sglang_tpu.kv_events import (
    END_SEQ_BYTES,
    EventBatch,
    block_hashes,
    encode_batch,
)
from sglang_tpu.tokenizer import load_tokenizer
from tests.component.router.kv_publisher import (
    PAGE,
    PROMPT,
    Publisher,
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
    EngineTwin,
    sample,
)
from tests.waiting import eventually_async
from tpuserve_router.kv import kv_events, kv_replay
from tpuserve_router.kv.kv_events import RECEIVE_HIGH_WATER_MARK
from tpuserve_router.kv.kv_replay import DRAIN_MAX_MESSAGES
from tpuserve_router.peering.kv_snapshot import SNAPSHOT_FORMAT

pytestmark = pytest.mark.component


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
