"""Active health checks: probe every worker's ``/health`` on an interval, eject and re-admit.

One owner task probes all workers concurrently every ``interval_seconds``; a worker added
later is probed at once. A probe passes on HTTP 200 within ``timeout_seconds``. A probe
that fails for a reason of the router's own (out of file descriptors or buffers) gives no
verdict: the worker is not blamed. The thresholds live on `Worker`; this module only runs
the probes and calls ``on_admitted`` when a worker becomes routable (`admission` then
learns its models and KV-event endpoints). A worker ejected by its probes has its requests in
flight that have no response head yet failed at once (`UpstreamPool.fail_unanswered`) and
retried on another worker; answers already coming (streams) go on, cut only by the stall
timer if they stop. A passing probe does not end an outlier
ejection (`outliers`). Not on the request hot path, so it uses aiohttp's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import aiohttp

from tpuserve_router.workers import Worker, WorkerRegistry

log = logging.getLogger(__name__)

LOCAL_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""Errors that say the router, not the worker, is short of something."""


class HealthChecker:
    def __init__(
        self,
        registry: WorkerRegistry,
        *,
        interval_seconds: float,
        timeout_seconds: float,
        failure_threshold: int,
        success_threshold: int,
        path: str = "/health",
        on_admitted: Callable[[Worker], Awaitable[None]] | None = None,
    ) -> None:
        self.registry = registry
        self.interval_seconds = interval_seconds
        self.timeout_seconds = timeout_seconds
        self.failure_threshold = failure_threshold
        self.success_threshold = success_threshold
        self.path = path
        self.on_admitted = on_admitted
        self._session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self.interval_seconds > 0

    def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
        )
        if self.enabled:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def watch(self, worker: Worker) -> None:
        """A new worker: probe it now (or, with checks off, admit it at once)."""
        if self.enabled:
            self._spawn(self.check(worker))
        else:
            worker.health_check_passed(1)
            self._spawn(self._admitted(worker))

    async def check(self, worker: Worker) -> None:
        session = self._session
        if session is None:
            return
        try:
            async with session.get(worker.name + self.path) as response:
                await response.read()
                passed = response.status == 200
        except OSError as err:  # aiohttp's connection errors and timeouts are OSErrors too
            if err.errno in LOCAL_ERRNOS:
                log.warning("health check of %s not made: %s", worker.name, err)
                return
            passed = False
        except aiohttp.ClientError:
            passed = False
        if self.registry.get(worker.name) is not worker:
            return  # removed meanwhile
        if passed:
            if worker.health_check_passed(self.success_threshold):
                log.info("worker %s is routable", worker.name)
                await self._admitted(worker)
        elif worker.health_check_failed(self.failure_threshold):
            log.warning(
                "worker %s ejected after %d failed health checks",
                worker.name,
                worker.health_failures,
            )
            if worker.pool is not None:  # what it holds unanswered may never come
                worker.pool.fail_unanswered(f"failed {worker.health_failures} health checks")

    async def get_json(self, url: str) -> object:
        """GET a worker's JSON endpoint (for the app's model and server-info look-ups)."""
        if self._session is None:
            raise RuntimeError("health checker not started")
        async with self._session.get(url) as response:
            response.raise_for_status()
            return await response.json(content_type=None)

    @property
    def session(self) -> aiohttp.ClientSession | None:
        return self._session

    async def _admitted(self, worker: Worker) -> None:
        if self.on_admitted is not None:
            try:
                await self.on_admitted(worker)
            except Exception:  # a look-up failure must not stop health checking
                log.exception("could not complete the admission of worker %s", worker.name)

    async def _run(self) -> None:
        while True:
            workers = list(self.registry.workers)
            if workers:
                await asyncio.gather(*(self.check(w) for w in workers))
            await asyncio.sleep(self.interval_seconds)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
