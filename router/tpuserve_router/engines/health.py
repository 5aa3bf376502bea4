"""Active health checks: probe every worker's ``/health`` on an interval, eject and re-admit.

One owner task probes all workers concurrently every ``interval_seconds``; a worker added
later is probed at once. A probe passes on HTTP 200 within ``timeout_seconds``. A probe
that fails for a reason of the router's own (out of file descriptors or buffers) gives no
verdict: the worker is not blamed. The thresholds live on `Worker`; this module only runs
the probes and calls ``on_admitted`` when a worker becomes routable (`admission` then
learns its models and KV-event endpoints). A worker ejected by its probes has its requests in
flight that have no response head yet failed at once (`UpstreamPool.fail_unanswered`) and
retried on another worker; answers already coming (streams) go on, cut only by the stall
timer if they stop. A passing probe does not end an outlier ejection (`outliers`).

Probes go over the proxy's raw HTTP/1.1 connections (`proxy.UpstreamPool`, one kept alive
per worker, as Envoy's health checker reuses its connection): aiohttp's client, dialling
anew for each probe, cost about 1.2 ms of CPU a probe on a busy host, some 5 µs per routed
request at 500 requests/s in front of four workers. A probe on a kept-alive connection the
worker had closed while idle is made again at once on a new one (`UpstreamPool.open`). As
with aiohttp before, a probe must end within ``timeout_seconds`` (connecting included); unlike
it, a redirect is not followed (it fails the probe: only 200 passes), and an answer must say
its length or be chunked (SGLang's does; one delimited by the connection's end fails). A
local error number (`LOCAL_ERRNOS`) from connecting or from the connection gives no verdict.
aiohttp's session stays for the look-ups at admission (`get_json`) and for aborts
(`worker_session.WorkerSession`, which also reaches `unix:` workers).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import aiohttp
import orjson

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.engines.worker_session import WorkerSession
from tpuserve_router.engines.workers import Worker, WorkerRegistry

LOOKUP_MAX_BYTES: Final = 4 * 1024 * 1024
"""The most the router reads of a worker's ``/v1/models`` or ``/server_info`` (SGLang's are a
few kB; a long list of LoRA adapters stays far below)."""


async def read_bounded(response: aiohttp.ClientResponse, max_bytes: int, too_long: str) -> bytes:
    """A response's body, or ValueError(``too_long``) once it is longer than ``max_bytes``."""
    if (response.content_length or 0) > max_bytes:
        raise ValueError(too_long)
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 20):
        body += chunk
        if len(body) > max_bytes:
            raise ValueError(too_long)
    return bytes(body)


log = logging.getLogger(__name__)

LOCAL_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""Errors that say the router, not the worker, is short of something."""
MAX_HEAD_BYTES: Final = 64 << 10
MAX_BODY_BYTES: Final = 64 << 10
"""A probe's answer is read whole up to these bounds; a larger one fails the probe."""


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
        self._session: WorkerSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pools: dict[str, UpstreamPool] = {}
        registry.on_removed.append(self._forget)

    @property
    def enabled(self) -> bool:
        return self.interval_seconds > 0

    def start(self) -> None:
        self._session = WorkerSession(
            self.timeout_seconds, lambda: (w.name for w in self.registry.workers)
        )
        if self.enabled:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait([self._loop_task, *self._tasks])
        if self._session is not None:
            await self._session.close()
            self._session = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def watch(self, worker: Worker) -> None:
        """A new worker: probe it now (or, with checks off, admit it at once)."""
        if self.enabled:
            self._spawn(self.check(worker))
        else:
            worker.health_check_passed(1)
            self._spawn(self._admitted(worker))

    async def check(self, worker: Worker) -> None:
        if self._session is None or self.registry.get(worker.name) is not worker:
            return  # not started, stopped, or the worker was removed before its turn
        try:
            async with asyncio.timeout(self.timeout_seconds):
                passed = await self._probe(worker) == 200
        except TimeoutError:
            passed = False
        except UpstreamError as err:
            if err.errno in LOCAL_ERRNOS:
                log.warning("health check of %s not made: %s", worker.name, err)
                return
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

    async def _probe(self, worker: Worker) -> int:
        """``GET`` the health path on the worker's kept-alive connection: the status."""
        pool = self._pools.get(worker.name)
        if pool is None:
            pool = self._pools[worker.name] = UpstreamPool(
                worker.host, worker.port, connect_timeout_seconds=self.timeout_seconds,
                max_idle=1, max_head_bytes=MAX_HEAD_BYTES, max_body_bytes=MAX_BODY_BYTES,
            )  # fmt: skip
        request = f"GET {self.path} HTTP/1.1\r\nhost: ".encode() + pool.host_header + b"\r\n\r\n"

        async def exchange(conn: UpstreamConnection) -> None:
            conn.send(request)
            await conn.wait_head()

        conn = await pool.open(exchange)
        try:
            await conn.read_all()
            return conn.status
        finally:
            pool.release(conn)

    def _forget(self, worker: Worker) -> None:
        pool = self._pools.pop(worker.name, None)
        if pool is not None:
            pool.close()

    async def get_json(self, url: str) -> object:
        """GET a worker's JSON endpoint (for the app's model and server-info look-ups), read
        up to `LOOKUP_MAX_BYTES` (ValueError beyond: a worker cannot make the router hold
        what it sends)."""
        if self._session is None:
            raise RuntimeError("health checker not started")
        async with self._session.get(url) as response:
            response.raise_for_status()
            too_long = f"the answer is larger than the router reads ({LOOKUP_MAX_BYTES} bytes)"
            return orjson.loads(await read_bounded(response, LOOKUP_MAX_BYTES, too_long))

    @property
    def session(self) -> WorkerSession | None:
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
                results = await asyncio.gather(
                    *(self.check(w) for w in workers), return_exceptions=True
                )
                for worker, result in zip(workers, results, strict=True):
                    if isinstance(result, Exception):  # a bug must not end the probing
                        log.error("health check of %s failed", worker.name, exc_info=result)
            await asyncio.sleep(self.interval_seconds)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
