"""Active health probes against a stand-in worker on loopback: over one kept-alive connection,
replaced when the worker closes it while idle (no failure counted), and a probe that hangs
past its timeout fails, ejecting the worker after the threshold and re-admitting it after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tests.fakes import LoopbackApp
from tests.waiting import eventually_async
from tpuserve_router.engines.health import HealthChecker
from tpuserve_router.engines.workers import Worker, WorkerRegistry, WorkerSpec

pytestmark = pytest.mark.component


class HealthWorker(LoopbackApp):
    """Answers /health 200 (after ``delay`` seconds); counts probes and connections."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.probes = 0
        self.peers: set[object] = set()
        self.close_after_answer = False
        app = web.Application()
        app.add_routes([web.get("/health", self._health)])
        super().__init__(app)

    async def _health(self, request: web.Request) -> web.Response:
        self.probes += 1
        transport = request.transport
        self.peers.add(transport.get_extra_info("peername") if transport else None)
        await asyncio.sleep(self.delay)
        if self.close_after_answer and transport is not None:  # as an idle timeout would
            asyncio.get_running_loop().call_later(0.01, transport.close)
        return web.Response(text="ok")


@pytest.fixture
async def health_worker() -> AsyncIterator[HealthWorker]:
    worker = HealthWorker()
    await worker.start()
    yield worker
    await worker.stop()


def probing(url: str, probe_seconds: float = 5.0) -> tuple[Worker, HealthChecker]:
    """A worker on ``url`` probed every 20 ms (ejected after 2 failures)."""
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(url))
    checker = HealthChecker(
        registry, interval_seconds=0.02, timeout_seconds=probe_seconds, failure_threshold=2,
        success_threshold=1,
    )  # fmt: skip
    checker.start()
    return worker, checker


async def test_probes_keep_one_connection_alive(health_worker: HealthWorker) -> None:
    worker, checker = probing(health_worker.url)
    try:
        await eventually_async(lambda: health_worker.probes >= 6, what="six probes")
        assert worker.healthy
        assert len(health_worker.peers) == 1
    finally:
        await checker.stop()


async def test_a_connection_the_worker_closed_is_replaced_without_a_failure(
    health_worker: HealthWorker,
) -> None:
    worker, checker = probing(health_worker.url)
    try:
        await eventually_async(lambda: worker.healthy, what="admission")
        health_worker.close_after_answer = True
        await eventually_async(lambda: len(health_worker.peers) >= 4, what="redials")
        assert worker.healthy
        assert worker.health_failures == 0
    finally:
        await checker.stop()


async def test_a_probe_past_its_timeout_fails_and_the_worker_comes_back(
    health_worker: HealthWorker,
) -> None:
    worker, checker = probing(health_worker.url, probe_seconds=0.1)
    try:
        await eventually_async(lambda: worker.healthy, what="admission")
        health_worker.delay = 0.3
        await eventually_async(lambda: not worker.healthy, what="the ejection")
        assert worker.health_failures >= 2
        health_worker.delay = 0.0
        await eventually_async(lambda: worker.healthy, what="re-admission")
    finally:
        await checker.stop()


async def test_a_removed_worker_is_not_probed(health_worker: HealthWorker) -> None:
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec(health_worker.url))
    checker = HealthChecker(
        registry, interval_seconds=3600.0, timeout_seconds=5.0, failure_threshold=2,
        success_threshold=1,
    )  # fmt: skip
    checker.start()
    try:
        registry.remove(worker.name)
        await checker.check(worker)  # e.g. a check scheduled just before the removal
        assert health_worker.probes == 0
    finally:
        await checker.stop()
