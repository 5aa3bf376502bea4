"""Poll every worker's engine load (SGLang's ``GET /v1/loads``) into the shared load view.

Every ``interval_seconds`` (at most: see below) each worker with no poll still under way is
asked for its load; the answer goes through `load_view.set_peer_load`, so policies see the
requests and queued prefill other router replicas put there. While no engine shows anything
beyond this replica's own counts, the wait between passes doubles up to 8 intervals, and the
first poll that shows something, fails, or is still under way at the next pass brings it
back (`load_view.next_poll_gap`; one wait for all workers, so one failing worker keeps them
all polled at the interval). A worker whose
engine does not answer keeps its last estimate for `load_view.STALE_POLLS` intervals, then
falls back to this router's own counts.
Each worker is asked through its engine's adapter (`engine_types`): SGLang's ``/v1/loads``,
SGLang-JAX's ``/get_server_info``. An engine that answers ``/v1/loads`` 404 in a row
(`UNSUPPORTED_AFTER_404S`) is asked ``/get_server_info`` once under ``--engine-type auto``: its
internal states in SGLang-JAX's shape make it SGLang-JAX (polled there from then on); otherwise
(SGLang before 0.5.22, another server) it is not polled again until it is re-added. A poll every
100 ms per worker adds up (40 a second in front of four engines), so it goes over the proxy's
own raw HTTP/1.1 connections (`proxy.UpstreamPool`, one kept-alive connection per worker, its
own pool: a health ejection's ``fail_unanswered`` leaves polls alone); aiohttp's client cost
about eight times as much CPU per poll, some 40 µs per routed request at 500 requests/s
(bench/router_overhead.py).

A pass is one timer callback, not a task per poll: on a kept-alive connection the request is
written at once and the answer taken in the connection's own callback (`_PollConnection`),
so a pass over four engines wakes the event loop about six times instead of about ten (a
wake-up costs more than the poll's own Python): polling four engine twins took ~6.5 ms of the
idle router's CPU a second instead of ~9.5 ms. Only a poll that must dial (the first, or after
the engine closed the connection) runs as a task, through `poll`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Final, cast

import orjson

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.engines.engine_types import (
    ADAPTERS,
    AUTO,
    LOAD_KEYS,
    SGLANG,
    SGLANG_JAX,
    EngineAdapter,
    EngineLoad,
    LoadAnswerError,
    adapter,
    detect,
    parse_loads,
)
from tpuserve_router.engines.load_view import (
    STALE_POLLS,
    clear_peer_load,
    next_poll_gap,
    set_peer_load,
)
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.engines.workers import Worker, WorkerRegistry

log = logging.getLogger(__name__)

LOADS_PATH: Final = ADAPTERS[SGLANG].load_path
UNSUPPORTED_AFTER_404S: Final = 3
"""Consecutive 404s from one worker before it is taken for an engine without the path (one
could come from a proxy or an engine still starting)."""
MAX_HEAD_BYTES: Final = 64 << 10
MAX_BODY_BYTES: Final = ADAPTERS[SGLANG].max_load_body_bytes
"""An answer's bounds (SGLang's adapter; SGLang-JAX's server info may take more); a larger
one fails the poll."""
parse_engine_load = parse_loads
__all__ = ["LOAD_KEYS", "EngineLoad", "LoadAnswerError", "LoadPoller", "parse_engine_load"]


class _PollConnection(UpstreamConnection):
    """An `UpstreamConnection` that, once told whom (``answered``), calls them when the answer
    is complete or has failed: no task waits on it."""

    answered: Callable[[UpstreamConnection], None] | None = None

    def _wake(self) -> None:
        if self.done or self.error is not None:
            answered, self.answered = self.answered, None
            if answered is not None:
                answered(self)
        super()._wake()


class LoadPoller:
    """Owns the poll timer; ``booked_prefill_tokens(name)`` is the policy's booked prefill."""

    def __init__(
        self,
        registry: WorkerRegistry,
        booked_prefill_tokens: Callable[[str], int],
        *,
        interval_seconds: float,
        timeout_seconds: float,
        engine_type: str = AUTO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.engine_type = engine_type  # `--engine-type`: every worker's, or auto (detected)
        self._adapters: dict[str, EngineAdapter] = {}  # each worker's, once first polled
        self._probing: set[str] = set()  # auto: asked /get_server_info after /v1/loads' 404s
        self.booked_prefill_tokens = booked_prefill_tokens
        self.interval_seconds = interval_seconds
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        self.polled_at: dict[str, float] = {}
        self.unsupported: set[str] = set()
        self._not_found: dict[str, int] = {}  # consecutive 404s per worker
        self._polling: dict[str, asyncio.Task[None]] = {}  # polls that dial, by worker
        self._asking: dict[str, UpstreamConnection] = {}  # polls answered by callback
        self._logged: set[tuple[str, str]] = set()
        self._pools: dict[str, UpstreamPool] = {}
        self._started = False
        self._timer: asyncio.Handle | None = None
        self.gap = interval_seconds  # the wait after the last pass (`load_view.next_poll_gap`)
        self._passed_at = 0.0  # the last pass's loop time
        registry.on_removed.append(self._forget)

    def start(self) -> None:
        self._started = True
        self.gap = self.interval_seconds
        self._timer = asyncio.get_running_loop().call_soon(self._pass)

    async def stop(self) -> None:
        self._started = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await cancel_and_wait(self._polling.values())
        self._polling.clear()
        for conn in self._asking.values():
            cast(_PollConnection, conn).answered = None
            conn.close()
        self._asking.clear()
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    async def poll(self, worker: Worker) -> None:
        """Ask one worker's engine for its load and take it into the view."""
        if not self._started or self.registry.get(worker.name) is not worker:
            return  # stopped, or removed before this poll began: no pool for it
        try:
            status, body = await self._get(worker)  # bounded by the connection's deadlines
        except UpstreamError as err:
            self._failed(worker.name, err.reason, err)
            return
        except OSError as failed:
            self._failed(worker.name, type(failed).__name__, failed)
            return
        self._take(worker, status, body)

    def adapter_of(self, worker: Worker) -> EngineAdapter:
        """The worker's engine adapter: `--engine-type`'s, or SGLang's until detection
        finds another (`engine_types.detect`)."""
        found = self._adapters.get(worker.name)
        if found is None:
            found = self._adapters[worker.name] = adapter(self.engine_type)
            worker.engine_type = found.name if self.engine_type != AUTO else AUTO
        return found

    def _take(self, worker: Worker, status: int, body: bytes) -> None:
        """Take one answer of ``worker``'s engine into the view (or note why not)."""
        engine = self.adapter_of(worker)
        try:
            if worker.name in self._probing:
                self._detected(worker, status, body)
                return
            if status == 404:
                self._missing(worker)
                return
            self._not_found.pop(worker.name, None)
            if status != 200:
                raise LoadAnswerError(f"{engine.load_path} answered HTTP {status}")
            load = engine.parse_load(orjson.loads(body))
        except ValueError as err:  # orjson's errors, LoadAnswerError
            self._failed(worker.name, type(err).__name__, err)
            return
        if self.registry.get(worker.name) is not worker:
            return  # removed meanwhile
        booked = self.booked_prefill_tokens(worker.name)
        prefill = booked if load.waiting_uncached_tokens is None else load.waiting_uncached_tokens
        worker.engine_load = load
        if set_peer_load(worker, load.requests, prefill, booked):
            self._poll_soon()
        self.polled_at[worker.name] = self.clock()

    def _detected(self, worker: Worker, status: int, body: bytes) -> None:
        """The answer of ``/get_server_info`` asked after ``/v1/loads``' 404s: SGLang-JAX's
        internal states make the worker SGLang-JAX (polled there from now on); anything else
        leaves it unpolled, its load only what this router sent."""
        self._probing.discard(worker.name)
        found = None
        if status == 200:
            try:
                found = detect(orjson.loads(body))
            except ValueError:
                found = None
        if found is None:
            self._unsupported(worker)
            return
        self._use(worker, ADAPTERS[found])
        log.info(
            "worker %s is %s: its load from %s, its prefix routing %s",
            worker.name, found, ADAPTERS[found].load_path, ADAPTERS[found].prefix_routing,
        )  # fmt: skip
        self._take(worker, status, body)

    def _use(self, worker: Worker, engine: EngineAdapter) -> None:
        """Poll ``worker`` through ``engine``'s adapter from now on (a fresh pool: its answers
        have their own bound)."""
        self._adapters[worker.name] = engine
        worker.engine_type = engine.name
        pool = self._pools.pop(worker.name, None)
        if pool is not None:
            pool.close()

    def _failed(self, name: str, kind: str, err: BaseException) -> None:
        self._log_once(name, kind, err)
        self._poll_soon()

    def _poll_soon(self) -> None:
        """A poll found load beyond this replica's own (or failed): the next pass comes one
        interval after the last, not later (`load_view.next_poll_gap`)."""
        self.gap = next_poll_gap(self.gap, self.interval_seconds, news=True)
        timer = self._timer
        if not self._started or not isinstance(timer, asyncio.TimerHandle):
            return  # stopped, or the first pass is still to come
        due = self._passed_at + self.gap
        if timer.when() > due:
            timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(due, self._pass)

    def _pool(self, worker: Worker) -> UpstreamPool:
        pool = self._pools.get(worker.name)
        if pool is None:
            pool = self._pools[worker.name] = UpstreamPool(
                worker.host, worker.port, connect_timeout_seconds=self.timeout_seconds,
                max_idle=1, max_head_bytes=MAX_HEAD_BYTES,
                max_body_bytes=self._asked_adapter(worker).max_load_body_bytes,
                connection=_PollConnection,
            )  # fmt: skip
        return pool

    def _asked_adapter(self, worker: Worker) -> EngineAdapter:
        """The adapter whose path the next poll asks (SGLang-JAX's while detecting)."""
        if worker.name in self._probing:
            return ADAPTERS[SGLANG_JAX]
        return self.adapter_of(worker)

    def _request(self, pool: UpstreamPool, worker: Worker) -> bytes:
        path = self._asked_adapter(worker).load_path
        return (
            b"GET " + path.encode() + b" HTTP/1.1\r\nhost: " + pool.host_header
            + b"\r\naccept: application/json\r\n\r\n"
        )  # fmt: skip

    async def _get(self, worker: Worker) -> tuple[int, bytes]:
        """``GET /v1/loads`` on the worker's kept-alive connection: (status, body)."""
        pool = self._pool(worker)
        request = self._request(pool, worker)
        conn = await pool.open(lambda c: self._exchange(c, request))
        try:
            return conn.status, await conn.read_all()
        finally:
            pool.release(conn)

    def _send(self, conn: UpstreamConnection, request: bytes) -> None:
        """Write ``request``; the connection's one deadline timer bounds the head and the whole
        answer by the poll timeout (a missed one fails the poll with reason
        ``first_byte_timeout`` or ``request_timeout``)."""
        timeout = self.timeout_seconds
        conn.send(request)
        conn.set_deadlines(timeout, timeout, timeout)

    async def _exchange(self, conn: UpstreamConnection, request: bytes) -> None:
        """Send ``request`` and wait for the head."""
        self._send(conn, request)
        await conn.wait_head()

    def _ask(self, worker: Worker) -> bool:
        """Poll ``worker`` on its idle kept-alive connection, the answer taken by callback
        (`_answered`); False when it has none (the poll must dial: `poll`)."""
        pool = self._pool(worker)
        conn = pool.take_idle()
        if conn is None:
            return False
        cast(_PollConnection, conn).answered = functools.partial(self._answered, worker, pool)
        self._asking[worker.name] = conn
        self._send(conn, self._request(pool, worker))
        return True

    def _answered(self, worker: Worker, pool: UpstreamPool, conn: UpstreamConnection) -> None:
        """``conn``'s answer is complete or failed (called from its protocol callbacks)."""
        if self._asking.get(worker.name) is conn:
            del self._asking[worker.name]
        error = conn.error
        status, body = conn.status, b"".join(conn.chunks)
        conn.chunks.clear()
        pool.release(conn)  # kept when complete and kept alive, else closed
        if error is None:
            try:  # inside the parser's callback: httptools would take an error for bad HTTP
                self._take(worker, status, body)
            except Exception:  # a bug must not pass for the engine's fault, nor silently
                log.exception("taking the load of %s failed", worker.name)
        elif error.reason == "reset_before_response" and conn.reused and not conn.received_any:
            # closed by the engine while idle (it never read the request): dialled anew
            # at the next pass, as `UpstreamPool.open` would at once
            log.debug("load poll of %s: %s", worker.name, error)
            self._poll_soon()
        else:
            self._failed(worker.name, error.reason, error)

    def _missing(self, worker: Worker) -> None:
        """A 404 from ``worker``: after `UNSUPPORTED_AFTER_404S` in a row, its engine is
        taken not to have the path and no longer polled (unless the worker was replaced
        meanwhile: its successor is asked afresh)."""
        if self.registry.get(worker.name) is not worker:
            return
        self._poll_soon()  # an answer of no use: asked again an interval on
        count = self._not_found.get(worker.name, 0) + 1
        self._not_found[worker.name] = count
        if count < UNSUPPORTED_AFTER_404S:
            return
        self._not_found.pop(worker.name, None)
        if self.engine_type == AUTO and self.adapter_of(worker).name == SGLANG:
            self._probing.add(worker.name)  # SGLang-JAX? its /get_server_info says (`_detected`)
            pool = self._pools.pop(worker.name, None)
            if pool is not None:
                pool.close()
            return
        self._unsupported(worker)

    def _unsupported(self, worker: Worker) -> None:
        self.unsupported.add(worker.name)
        log.info(
            "worker %s has no %s (SGLang before 0.5.22?): its load is only what this router sent",
            worker.name,
            self.adapter_of(worker).load_path,
        )

    def expire(self) -> None:
        """Drop the estimates of workers not polled for `STALE_POLLS` intervals (a quiet
        replica's estimates, polled less often, are of nothing beyond its own counts:
        dropping them changes nothing)."""
        oldest = self.clock() - STALE_POLLS * self.interval_seconds
        for worker in self.registry.workers:
            at = self.polled_at.get(worker.name)
            if at is not None and at < oldest:
                del self.polled_at[worker.name]
                clear_peer_load(worker)

    def _pass(self) -> None:
        """Poll every worker with no poll under way; then again after the wait
        `load_view.next_poll_gap` gives (twice the last, unless a poll of this pass finds
        load beyond this replica's own: `_poll_soon`)."""
        loop = asyncio.get_running_loop()
        self._passed_at = loop.time()
        self.gap = next_poll_gap(self.gap, self.interval_seconds, news=False)
        try:
            self._start_polls(loop)
        except Exception:  # a bug must not end the polling silently
            log.exception("starting the load polls failed")
        finally:
            if self._started:
                self._timer = loop.call_at(self._passed_at + self.gap, self._pass)

    def _start_polls(self, loop: asyncio.AbstractEventLoop) -> None:
        for worker in self.registry.workers:
            name = worker.name
            if name in self.unsupported:
                continue
            if name in self._polling or name in self._asking:  # slow to answer: as a failure
                self.gap = next_poll_gap(self.gap, self.interval_seconds, news=True)
                continue
            if self._ask(worker):
                continue
            task = loop.create_task(self.poll(worker))
            self._polling[name] = task
            task.add_done_callback(functools.partial(self._poll_done, name))
        self.expire()

    def _poll_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._polling.get(name) is task:
            del self._polling[name]

    def _forget(self, worker: Worker) -> None:
        self.polled_at.pop(worker.name, None)
        conn = self._asking.pop(worker.name, None)
        if conn is not None:  # its answer is of no use now
            cast(_PollConnection, conn).answered = None
            conn.close()
        task = self._polling.pop(worker.name, None)
        if task is not None:
            task.cancel()
        pool = self._pools.pop(worker.name, None)
        if pool is not None:
            pool.close()
        self.unsupported.discard(worker.name)
        self._not_found.pop(worker.name, None)
        self._adapters.pop(worker.name, None)
        self._probing.discard(worker.name)
        self._logged = {logged for logged in self._logged if logged[0] != worker.name}

    def _log_once(self, name: str, kind: str, err: BaseException) -> None:
        if (name, kind) in self._logged:
            log.debug("load poll of %s failed: %s", name, err)
            return
        self._logged.add((name, kind))
        log.warning(
            "load poll of %s failed (%s): %s; further failures are logged at debug",
            name,
            kind,
            err or kind,
        )
