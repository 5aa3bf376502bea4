"""The engine-load poller against a stand-in engine on loopback: a worker is given up as
having no /v1/loads only after several 404s in a row, and never because of its predecessor's
answer; an unexpected error does not end the polling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tests.fakes import LoopbackApp
from tests.waiting import eventually_async
from tpuserve_router.engine_loads import (
    LOAD_KEYS,
    LOADS_PATH,
    MAX_BODY_BYTES,
    UNSUPPORTED_AFTER_404S,
    LoadPoller,
)
from tpuserve_router.workers import Worker, WorkerRegistry, WorkerSpec

pytestmark = pytest.mark.component


class LoadsEngine(LoopbackApp):
    """Answers /v1/loads with ``status`` (an empty load when 200); counts the polls."""

    def __init__(self) -> None:
        self.status = 404
        self.polls = 0
        app = web.Application()
        app.add_routes([web.get(LOADS_PATH, self._loads)])
        super().__init__(app)

    async def _loads(self, _request: web.Request) -> web.Response:
        self.polls += 1
        idle = dict.fromkeys(LOAD_KEYS, 0)
        return web.json_response({"loads": [idle]}, status=self.status)


@pytest.fixture
async def engine() -> AsyncIterator[LoadsEngine]:
    engine = LoadsEngine()
    await engine.start()
    yield engine
    await engine.stop()


async def started_poller(registry: WorkerRegistry, engine: LoadsEngine) -> LoadPoller:
    """A poller whose interval is an hour, after its first pass (answered 200): only the
    polls a test makes count."""
    poller = LoadPoller(registry, lambda _: 0, interval_seconds=3600.0, timeout_seconds=5.0)
    engine.status = 200
    poller.start()
    await eventually_async(lambda: engine.polls == len(registry.workers), what="the first pass")
    engine.status = 404
    return poller


async def test_a_worker_is_unsupported_only_after_several_404s_in_a_row(
    engine: LoadsEngine,
) -> None:
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(engine.url))
    assert UNSUPPORTED_AFTER_404S > 1
    poller = await started_poller(registry, engine)
    try:
        for _ in range(UNSUPPORTED_AFTER_404S - 1):
            await poller.poll(worker)
        assert worker.name not in poller.unsupported
        engine.status = 200  # the engine answers after all: the count starts over
        await poller.poll(worker)
        engine.status = 404
        for _ in range(UNSUPPORTED_AFTER_404S - 1):
            await poller.poll(worker)
        assert worker.name not in poller.unsupported
        await poller.poll(worker)
        assert worker.name in poller.unsupported
    finally:
        await poller.stop()


async def test_a_404_for_a_replaced_worker_does_not_mark_its_successor(
    engine: LoadsEngine,
) -> None:
    registry = WorkerRegistry()
    old: Worker = registry.add(WorkerSpec(engine.url))
    registry.remove(old.name)
    registry.add(WorkerSpec(engine.url))  # same URL, a new worker
    poller = await started_poller(registry, engine)
    try:
        for _ in range(UNSUPPORTED_AFTER_404S):
            await poller.poll(old)  # answers that were on their way for the old one
        assert old.name not in poller.unsupported
    finally:
        await poller.stop()


async def test_an_unexpected_error_does_not_end_the_polling(engine: LoadsEngine) -> None:
    calls = 0

    def clock() -> float:  # fails once, in the poll loop's own work
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        return 0.0

    registry = WorkerRegistry()
    registry.add(WorkerSpec(engine.url))
    poller = LoadPoller(
        registry, lambda _: 0, interval_seconds=0.01, timeout_seconds=5.0, clock=clock
    )
    engine.status = 200
    poller.start()
    try:
        await eventually_async(lambda: calls >= 3, what="the polling going on")
    finally:
        await poller.stop()


class PeerCountingEngine(LoadsEngine):
    """Also notes each poll's client address (one per TCP connection) and can answer with a
    body of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.status = 200
        self.peers: set[object] = set()
        self.body: bytes | None = None
        self.close_after_answer = False

    async def _loads(self, request: web.Request) -> web.Response:
        transport = request.transport
        self.peers.add(transport.get_extra_info("peername") if transport else None)
        if self.close_after_answer and transport is not None:  # as an idle timeout would
            asyncio.get_running_loop().call_later(0.05, transport.close)
        if self.body is not None:
            self.polls += 1
            return web.Response(body=self.body, content_type="application/json")
        return await super()._loads(request)


@pytest.fixture
async def counting_engine() -> AsyncIterator[PeerCountingEngine]:
    engine = PeerCountingEngine()
    await engine.start()
    yield engine
    await engine.stop()


@contextlib.asynccontextmanager
async def polling(engine: LoadsEngine) -> AsyncIterator[tuple[WorkerRegistry, Worker, LoadPoller]]:
    """One worker on ``engine`` and a started poller (an hour between passes: only its first
    pass and the polls a test makes run), stopped on the way out."""
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(engine.url))
    poller = LoadPoller(registry, lambda _: 0, interval_seconds=3600.0, timeout_seconds=5.0)
    poller.start()
    try:
        yield registry, worker, poller
    finally:
        await poller.stop()


async def test_polls_keep_one_connection_alive_and_take_the_load(
    counting_engine: PeerCountingEngine,
) -> None:
    async with polling(counting_engine) as (_, worker, poller):
        await eventually_async(lambda: worker.name in poller.polled_at, what="the first poll")
        for _ in range(5):
            await poller.poll(worker)
        assert counting_engine.polls == 6
        assert len(counting_engine.peers) == 1  # one kept-alive connection for all six


@pytest.mark.parametrize(
    ("body", "reason"),
    [(b"x" * (MAX_BODY_BYTES + 1), "response_too_large"), (b"{not json", "JSONDecodeError")],
)
async def test_an_unusable_answer_fails_the_poll_with_its_reason(
    counting_engine: PeerCountingEngine,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    reason: str,
) -> None:
    counting_engine.body = body
    async with polling(counting_engine) as (_, worker, poller):
        await eventually_async(lambda: counting_engine.polls >= 1, what="the first poll")
        await poller.poll(worker)  # awaited here: its outcome is settled
        assert worker.name not in poller.polled_at
        assert any(reason in r.getMessage() for r in caplog.records), caplog.text
        counting_engine.body = None  # a good answer is taken again
        await poller.poll(worker)
        assert worker.name in poller.polled_at


async def test_a_connection_the_engine_closed_is_replaced(
    counting_engine: PeerCountingEngine,
) -> None:
    async with polling(counting_engine) as (_, worker, poller):
        await eventually_async(lambda: worker.name in poller.polled_at, what="the first poll")
        counting_engine.close_after_answer = True
        await poller.poll(worker)
        await asyncio.sleep(0.2)  # the engine has closed the kept-alive connection
        counting_engine.close_after_answer = False
        del poller.polled_at[worker.name]
        await poller.poll(worker)
        assert worker.name in poller.polled_at  # answered, on a new connection
        assert len(counting_engine.peers) == 2


async def test_a_worker_removed_before_its_poll_is_not_polled(
    counting_engine: PeerCountingEngine,
) -> None:
    async with polling(counting_engine) as (registry, worker, poller):
        await eventually_async(lambda: counting_engine.polls == 1, what="the first poll")
        registry.remove(worker.name)
        await poller.poll(worker)  # e.g. a poll task created just before the removal
        assert counting_engine.polls == 1
