"""The engine-load poller against a stand-in engine on loopback: a worker is given up as
having no /v1/loads only after several 404s in a row, and never because of its predecessor's
answer; an unexpected error does not end the polling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.fakes import LoopbackApp
from tests.waiting import eventually_async
from tpuserve_router.engines.engine_loads import (
    LOAD_KEYS,
    LOADS_PATH,
    MAX_BODY_BYTES,
    UNSUPPORTED_AFTER_404S,
    LoadPoller,
)
from tpuserve_router.engines.load_view import QUIET_POLL_FACTOR
from tpuserve_router.engines.workers import Worker, WorkerRegistry, WorkerSpec

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
        # --engine-type auto: one more poll asks /get_server_info whether it is SGLang-JAX;
        # this engine has none, so it is an engine whose load is only what the router sent
        assert worker.name not in poller.unsupported
        await poller.poll(worker)
        assert worker.name in poller.unsupported
        assert worker.engine_type == "auto"
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


class SlowEngine(PeerCountingEngine):
    """Answers with a load of its own, after ``delay`` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0.0
        self.running = 3
        self.asked = 0  # polls received (answered or not yet)

    async def _loads(self, request: web.Request) -> web.Response:
        self.asked += 1
        await asyncio.sleep(self.delay)
        self.body = orjson.dumps(
            {"loads": [{**dict.fromkeys(LOAD_KEYS, 0), "num_running_reqs": self.running}]}
        )
        return await super()._loads(request)


@pytest.fixture
async def slow_engine() -> AsyncIterator[SlowEngine]:
    engine = SlowEngine()
    await engine.start()
    yield engine
    await engine.stop()


async def test_passes_poll_on_the_kept_alive_connection_without_a_task(
    slow_engine: SlowEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """After the first poll (which dials), each pass writes on the kept-alive connection and
    takes the answer in the connection's callback; a connection the engine closed while idle
    is dialled anew at the next pass, with nothing logged above debug."""
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(slow_engine.url))
    poller = LoadPoller(registry, lambda _: 0, interval_seconds=0.02, timeout_seconds=5.0)
    poller.start()
    try:
        await eventually_async(lambda: slow_engine.polls >= 5, what="five passes")
        assert len(slow_engine.peers) == 1
        created: list[str] = []  # the tasks created from now on

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            created.append(coro.__qualname__)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop = asyncio.get_running_loop()
        loop.set_task_factory(factory)
        try:
            polls = slow_engine.polls
            await eventually_async(lambda: slow_engine.polls >= polls + 5, what="five more")
        finally:
            loop.set_task_factory(None)
        assert "LoadPoller.poll" not in created, created
        assert worker.peer_in_flight == 3
        slow_engine.running = 5
        await eventually_async(lambda: worker.peer_in_flight == 5, what="the next load taken")
        slow_engine.close_after_answer = True  # the engine drops each connection after it
        await eventually_async(lambda: len(slow_engine.peers) >= 3, what="redials")
        slow_engine.close_after_answer = False
        slow_engine.running = 7
        await eventually_async(lambda: worker.peer_in_flight == 7, what="the load after redials")
        assert len(slow_engine.peers) >= 3
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    finally:
        await poller.stop()


async def test_a_pass_answered_late_fails_with_its_reason_and_the_next_one_polls_again(
    slow_engine: SlowEngine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(slow_engine.url))
    poller = LoadPoller(registry, lambda _: 0, interval_seconds=0.02, timeout_seconds=0.2)
    poller.start()
    try:
        await eventually_async(lambda: worker.peer_in_flight == 3, what="the first load")
        slow_engine.delay = 0.5
        await eventually_async(
            lambda: any("first_byte_timeout" in r.getMessage() for r in caplog.records),
            what="the late answer failing",
        )
        slow_engine.delay = 0.0
        slow_engine.running = 4
        await eventually_async(lambda: worker.peer_in_flight == 4, what="polls going on")
    finally:
        await poller.stop()


async def test_stopping_with_a_poll_under_way_logs_no_failure(
    slow_engine: SlowEngine, caplog: pytest.LogCaptureFixture
) -> None:
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(slow_engine.url))
    poller = LoadPoller(registry, lambda _: 0, interval_seconds=0.02, timeout_seconds=5.0)
    poller.start()
    await eventually_async(lambda: worker.peer_in_flight == 3, what="the first load")
    slow_engine.delay = 1.0
    asked = slow_engine.asked
    await eventually_async(lambda: slow_engine.asked > asked, what="a poll under way")
    slow_engine.running = 9  # what the poll under way would bring, were it taken
    await poller.stop()
    # 3, or 0 if passes meanwhile found the poll under way longer than the estimate may live
    seen = worker.peer_in_flight
    await asyncio.sleep(1.2)  # past the engine's answer
    assert worker.peer_in_flight == seen != 9
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_quiet_engines_are_polled_less_until_one_shows_load_of_others(
    slow_engine: SlowEngine,
) -> None:
    """While every answer is within this replica's own counts, the wait between passes
    doubles up to `QUIET_POLL_FACTOR` intervals; an answer with others' load brings it back to
    the interval at once, and the passes go on at it while that lasts."""
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(slow_engine.url))
    slow_engine.running = 0
    interval = 0.01
    poller = LoadPoller(registry, lambda _: 0, interval_seconds=interval, timeout_seconds=5.0)
    poller.start()
    try:
        await eventually_async(
            lambda: poller.gap == pytest.approx(QUIET_POLL_FACTOR * interval), what="backing off"
        )
        timer = poller._timer
        assert isinstance(timer, asyncio.TimerHandle)
        assert timer.when() == pytest.approx(poller._passed_at + QUIET_POLL_FACTOR * interval)
        poller._poll_soon()  # as an answer with others' load does: the next pass comes sooner
        timer = poller._timer
        assert isinstance(timer, asyncio.TimerHandle)
        assert timer.when() == pytest.approx(poller._passed_at + interval)
        slow_engine.running = 2  # someone else's requests
        await eventually_async(lambda: worker.peer_in_flight == 2, what="the load seen")
        polls = slow_engine.polls
        await eventually_async(lambda: slow_engine.polls >= polls + 3, what="passes")
        assert poller.gap < QUIET_POLL_FACTOR * interval  # doubled at a pass, back at its answer
        slow_engine.running = 0
        await eventually_async(
            lambda: poller.gap == pytest.approx(QUIET_POLL_FACTOR * interval), what="again"
        )
        assert worker.peer_in_flight == 0
    finally:
        await poller.stop()
