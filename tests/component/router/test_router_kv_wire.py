"""The router reads the KV-event wires engines speak: SGLang 0.5.23's and the 0.5.6-0.5.19 one.

- A router started after the engine cached a prompt catches up from the engine's replay
  socket, against the twin speaking 0.5.23 (topic frame, tagged maps) and the legacy wire.
- In front of SGLang's *own* publisher (``ZmqEventPublisher`` from the pinned wheel) with two
  data-parallel ranks, found through a 0.5.23 ``/server_info`` ``kv_events`` block, the
  router subscribes to both ranks' ports, indexes each rank's blocks apart (one rank's
  ``AllBlocksCleared`` leaves the other's) and routes to the worker.
- A late router whose event loop is busy while SGLang's own publisher sends it a full replay
  buffer (10,000 batches, more than ZMQ's default queue of 1,000 messages, past which the
  publisher's ROUTER socket drops them) indexes every batch.
"""

from __future__ import annotations

import asyncio
import atexit
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import zmq

from sglang_tpu.kv_events import Wire, block_hashes, replay_request
from sglang_tpu.sim.kv_publisher import WIRE_ENV
from sglang_tpu.tokenizer import load_tokenizer
from tests.component.router.router_fleet import EngineTwin, sample, start_router, wait_ready
from tests.fakes import FakeSGLangWorker
from tests.sglang_kv_events import sglang_kv_events
from tests.waiting import eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.kv import kv_replay
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.metrics import KV_EVENT_SKIP_REASONS

pytestmark = pytest.mark.component

PAGE = 16
PROMPT = "A prompt the engine cached before the router started, long enough for pages. " * 8


def skipped(app: RouterApp, worker: str) -> float:
    name = "tpuserve_router_kv_events_skipped_total"
    return sum(sample(app, name, {"worker": worker, "reason": r}) for r in KV_EVENT_SKIP_REASONS)


def index_of(app: RouterApp) -> BlockIndex:
    assert app.block_index is not None
    return app.block_index


@pytest.mark.parametrize("wire", list(Wire), ids=[w.value for w in Wire])
async def test_a_router_started_late_catches_up_by_replay(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WIRE_ENV, wire.value)  # the twin process reads it
    engine = EngineTwin(["--time-scale", "0", "--page-size", str(PAGE)]).start()
    try:
        body = {"prompt": PROMPT, "max_tokens": 1}
        async with (
            aiohttp.ClientSession() as session,
            session.post(engine.url + "/v1/completions", json=body) as response,
        ):
            assert response.status == 200
        keys = BlockIndex(page_size=PAGE).keys(load_tokenizer().encode(PROMPT))
        config = RouterConfig(
            workers=(engine.url,), policy="precise", health_check_interval_seconds=0.3
        )
        app = await start_router(config)
        try:
            await wait_ready(app, 1)
            index = index_of(app)
            await eventually_async(
                lambda: index.match(keys, [engine.url]) == [len(keys)],
                what="the blocks cached before the router started, replayed",
            )
            replays = {"worker": engine.url, "result": "ok"}
            assert sample(app, "tpuserve_router_kv_event_replays_total", replays) >= 1
            assert skipped(app, engine.url) == 0
        finally:
            await app.stop()
    finally:
        engine.stop()


# ---------------------------------------------------------------- SGLang's own publisher


def sglang_publishers(ranks: int, topic: str) -> tuple[list[Any], int, int]:
    """SGLang's ``ZmqEventPublisher``s, one per DP rank, as a DP engine starts them: each
    offsets the configured ports by its rank (``bind`` as the launcher sets it)."""
    module = sglang_kv_events()
    for _ in range(20):  # the next port may be taken: try other bases
        base, replay_base = free_port(), free_port()
        publishers: list[Any] = []
        try:
            for rank in range(ranks):
                publishers.append(
                    module.ZmqEventPublisher(
                        attn_dp_rank=rank, endpoint=f"tcp://127.0.0.1:{base}",
                        replay_endpoint=f"tcp://127.0.0.1:{replay_base}", topic=topic, bind=True,
                    )
                )  # fmt: skip
        except zmq.ZMQError:
            for publisher in publishers:
                shut_down(publisher)
            continue
        return publishers, base, replay_base
    raise AssertionError("no free consecutive ports for the publishers")


def shut_down(publisher: Any) -> None:
    """Stop a publisher now, and not again at exit (SGLang registers ``shutdown`` with
    atexit, where a second call waits a second on its dead thread and warns)."""
    publisher.shutdown()
    atexit.unregister(publisher.shutdown)


def sglang_stored(tokens: list[int]) -> Any:
    """The batch SGLang 0.5.23 publishes when it caches ``tokens`` (one coalesced event)."""
    module = sglang_kv_events()
    full = tokens[: len(tokens) // PAGE * PAGE]
    stored = module.BlockStored(
        block_hashes=block_hashes(full, PAGE), parent_block_hash=None, token_ids=full,
        block_size=PAGE, lora_id=None, medium="GPU",
    )  # fmt: skip
    return module.KVEventBatch(ts=time.time(), events=[stored])


@pytest.fixture
def dp_publishers() -> Iterator[tuple[list[Any], int, int]]:
    publishers, base, replay_base = sglang_publishers(2, "kv")
    yield publishers, base, replay_base
    for publisher in publishers:
        shut_down(publisher)


@pytest.fixture
async def dp_worker(dp_publishers: tuple[list[Any], int, int]) -> AsyncIterator[str]:
    _, base, replay_base = dp_publishers
    block = {"publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": base,
             "topic": "kv", "block_size": PAGE, "dp_size": 2,
             "replay_endpoint_port_base": replay_base}  # fmt: skip
    worker = FakeSGLangWorker({"dp_size": 2, "page_size": PAGE, "kv_events": block})
    yield await worker.start()
    await worker.stop()


async def test_each_dp_rank_of_sglangs_publisher_is_indexed_apart(
    dp_publishers: tuple[list[Any], int, int], dp_worker: str
) -> None:
    publishers = dp_publishers[0]
    module = sglang_kv_events()
    tokenizer = load_tokenizer()
    first = tokenizer.encode("rank one cached this before the router came. " * 6)
    second = tokenizer.encode("rank zero caches this while the router listens. " * 6)
    publishers[1].publish(sglang_stored(first))  # before the router: only replay has it
    config = RouterConfig(workers=(dp_worker,), policy="precise",
                          health_check_interval_seconds=0.3,
                          policy_params={"predicted_ttl_seconds": "0"})  # fmt: skip
    app = await start_router(config)
    try:
        await wait_ready(app, 1)
        hub = app.kv
        assert hub is not None
        streams = await eventually_async(lambda: hub.endpoints(dp_worker), what="subscriptions")
        assert [e.events for e in streams] == [f"tcp://127.0.0.1:{dp_publishers[1] + r}"
                                               for r in range(2)]  # fmt: skip
        index = index_of(app)
        pages = (len(first) // PAGE, len(second) // PAGE)
        await eventually_async(lambda: index.worker_blocks(dp_worker, rank=1) == pages[0],
                               what="rank 1's blocks, replayed")  # fmt: skip

        def rank_zero_caught_up() -> bool:
            if index.worker_blocks(dp_worker, rank=0) == pages[1]:
                return True
            # A new SUB can miss its first live batch; the next one (seq > 0) makes the
            # router replay what it missed.
            publishers[0].publish(module.KVEventBatch(ts=time.time(), events=[]))
            return False

        publishers[0].publish(sglang_stored(second))
        await eventually_async(rank_zero_caught_up, what="rank 0's blocks", interval_seconds=0.2)
        keys = (index.keys(first), index.keys(second))
        assert index.match(keys[0], [dp_worker]) == [pages[0]]  # the worker, not a rank
        assert index.match(keys[1], [dp_worker]) == [pages[1]]

        publishers[1].publish(module.KVEventBatch(ts=time.time(), events=[
            module.AllBlocksCleared()]))  # fmt: skip
        await eventually_async(lambda: index.worker_blocks(dp_worker, rank=1) == 0,
                               what="rank 1's flush")  # fmt: skip
        assert index.worker_blocks(dp_worker, rank=0) == pages[1]
        assert index.match(keys[1], [dp_worker]) == [pages[1]]
        assert index.match(keys[0], [dp_worker]) == [0]
        resyncs = {"worker": dp_worker, "reason": "all_blocks_cleared"}
        assert sample(app, "tpuserve_router_kv_event_resyncs_total", resyncs) == 1
        assert skipped(app, dp_worker) == 0
    finally:
        await app.stop()


async def test_a_busy_late_router_takes_a_whole_replay_buffer_from_sglangs_publisher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SGLang keeps 10,000 batches for replay and sends a replay from a ROUTER socket in one
    # loop; that socket drops what the reader's queue cannot take (the end marker too). A
    # router started late, its event loop busy while the replay comes (here: blocked for
    # half a second after asking), must index every batch of a full buffer.
    def then_busy(start: int) -> list[bytes]:
        asyncio.get_running_loop().call_soon(time.sleep, 0.5)
        return replay_request(start)

    monkeypatch.setattr(kv_replay, "replay_request", then_busy)
    module = sglang_kv_events()
    (publisher,), base, replay_base = sglang_publishers(1, "kv")
    worker = None
    try:
        batches, pages = 10_000, 8
        for batch in range(batches):
            first = batch * pages * PAGE
            publisher.publish(sglang_stored(list(range(first, first + pages * PAGE))))
        await eventually_async(
            lambda: len(publisher._buffer) == batches, what="SGLang's replay buffer filled",
            timeout_seconds=30,
        )  # fmt: skip
        block = {"publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": base,
                 "topic": "kv", "block_size": PAGE, "dp_size": 1,
                 "replay_endpoint_port_base": replay_base}  # fmt: skip
        worker = FakeSGLangWorker({"dp_size": 1, "page_size": PAGE, "kv_events": block})
        url = await worker.start()
        app = await start_router(RouterConfig(workers=(url,), policy="precise"))
        try:
            await wait_ready(app, 1)
            index = index_of(app)
            await eventually_async(
                lambda: index.worker_blocks(url) == batches * pages,
                what="every batch of the replay buffer indexed", timeout_seconds=30,
            )  # fmt: skip
            # Every round asked for is followed by the blocked loop. On a starved machine
            # libzmq's I/O threads (the router's and SGLang's) also fall behind SGLang's send
            # loop and its ROUTER socket drops batches: the router asks again from the first
            # it lacks, so the catch-up still ends whole, counted once as ok, with no lag.
            replays = "tpuserve_router_kv_event_replays_total"
            await eventually_async(
                lambda: sample(app, replays, {"worker": url, "result": "ok"}) == 1,
                what="the catch-up counted whole", timeout_seconds=30,
            )  # fmt: skip
            assert sample(app, "tpuserve_router_kv_event_lag_batches", {"worker": url}) == 0
            assert skipped(app, url) == 0
            assert module.ZmqEventPublisher is type(publisher)  # SGLang's own, from the wheel
        finally:
            await app.stop()
    finally:
        if worker is not None:
            await worker.stop()
        shut_down(publisher)
