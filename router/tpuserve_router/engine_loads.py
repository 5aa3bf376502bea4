"""Poll every worker's engine load (SGLang's ``GET /v1/loads``) into the shared load view.

Every ``interval_seconds`` each worker with no poll still under way is asked for its load;
the answer goes through `load_view.set_peer_load`, so policies see the requests and queued
prefill other router replicas put there. A worker whose engine does not answer keeps its last
estimate for `load_view.STALE_POLLS` intervals, then falls back to this router's own counts.
An engine without ``/v1/loads`` (HTTP 404: SGLang before it, or another server) is not polled
again until it is re-added. Not on the request hot path, so it uses aiohttp's client with
kept-alive connections (a poll every 100 ms per worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import aiohttp

from tpuserve_router.load_view import STALE_POLLS, clear_peer_load, set_peer_load
from tpuserve_router.workers import Worker, WorkerRegistry

log = logging.getLogger(__name__)

LOADS_PATH: Final = "/v1/loads"
UNSUPPORTED_AFTER_404S: Final = 3
"""Consecutive 404s from one worker before it is taken for an engine without the path (one
could come from a proxy or an engine still starting)."""
LOAD_KEYS: Final = ("num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens")
"""The fields of each DP rank's load snapshot the view uses (SGLang 0.5.23 `LoadSnapshot`)."""


class LoadAnswerError(ValueError):
    """An answer of ``/v1/loads`` the router cannot use; the message names the field."""


@dataclass(frozen=True)
class EngineLoad:
    """One engine's load over all its data-parallel ranks."""

    requests: int
    """Running plus waiting requests."""
    waiting_uncached_tokens: int
    """Prompt tokens waiting for prefill compute (past each request's cached prefix)."""


def parse_engine_load(document: object) -> EngineLoad:
    """Sum ``/v1/loads``'s per-rank snapshots; raises `LoadAnswerError` naming what is wrong."""
    loads = document.get("loads") if isinstance(document, dict) else None
    if not isinstance(loads, list) or not loads:
        raise LoadAnswerError("/v1/loads: 'loads' must be a non-empty list of DP-rank snapshots")
    sums = dict.fromkeys(LOAD_KEYS, 0)
    for rank, snapshot in enumerate(loads):
        if not isinstance(snapshot, dict):
            raise LoadAnswerError(f"/v1/loads: loads[{rank}] must be an object")
        for key in LOAD_KEYS:
            value = snapshot.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LoadAnswerError(
                    f"/v1/loads: loads[{rank}].{key} is {value!r}; allowed: an integer >= 0"
                )
            sums[key] += value
    return EngineLoad(
        sums["num_running_reqs"] + sums["num_waiting_reqs"], sums["num_waiting_uncached_tokens"]
    )


class LoadPoller:
    """Owns the poll task; ``booked_prefill_tokens(name)`` is the policy's booked prefill."""

    def __init__(
        self,
        registry: WorkerRegistry,
        booked_prefill_tokens: Callable[[str], int],
        *,
        interval_seconds: float,
        timeout_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.booked_prefill_tokens = booked_prefill_tokens
        self.interval_seconds = interval_seconds
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        self.polled_at: dict[str, float] = {}
        self.unsupported: set[str] = set()
        self._not_found: dict[str, int] = {}  # consecutive 404s per worker
        self._polling: dict[str, asyncio.Task[None]] = {}
        self._logged: set[tuple[str, str]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        registry.on_removed.append(self._forget)

    def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            connector=aiohttp.TCPConnector(limit=0),
        )
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._polling.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._polling.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def poll(self, worker: Worker) -> None:
        """Ask one worker's engine for its load and take it into the view."""
        session = self._session
        if session is None:
            return
        try:
            async with session.get(worker.name + LOADS_PATH) as response:
                if response.status == 404:
                    self._missing(worker)
                    return
                self._not_found.pop(worker.name, None)
                response.raise_for_status()
                load = parse_engine_load(await response.json(content_type=None))
        except (OSError, aiohttp.ClientError, ValueError) as err:  # TimeoutError is an OSError
            self._log_once(worker.name, type(err).__name__, err)
            return
        if self.registry.get(worker.name) is not worker:
            return  # removed meanwhile
        booked = self.booked_prefill_tokens(worker.name)
        set_peer_load(worker, load.requests, load.waiting_uncached_tokens, booked)
        self.polled_at[worker.name] = self.clock()

    def _missing(self, worker: Worker) -> None:
        """A 404 from ``worker``: after `UNSUPPORTED_AFTER_404S` in a row, its engine is
        taken not to have the path and no longer polled (unless the worker was replaced
        meanwhile: its successor is asked afresh)."""
        if self.registry.get(worker.name) is not worker:
            return
        count = self._not_found.get(worker.name, 0) + 1
        self._not_found[worker.name] = count
        if count < UNSUPPORTED_AFTER_404S:
            return
        self.unsupported.add(worker.name)
        log.info(
            "worker %s has no %s (SGLang before 0.5.22?): its load is only what this router sent",
            worker.name,
            LOADS_PATH,
        )

    def expire(self) -> None:
        """Drop the estimates of workers not polled for `STALE_POLLS` intervals."""
        oldest = self.clock() - STALE_POLLS * self.interval_seconds
        for worker in self.registry.workers:
            at = self.polled_at.get(worker.name)
            if at is not None and at < oldest:
                del self.polled_at[worker.name]
                clear_peer_load(worker)

    async def _run(self) -> None:
        while True:
            try:
                self._start_polls()
            except Exception:  # a bug must not end the polling silently
                log.exception("starting the load polls failed")
            await asyncio.sleep(self.interval_seconds)

    def _start_polls(self) -> None:
        for worker in self.registry.workers:
            name = worker.name
            if name in self.unsupported or name in self._polling:
                continue
            task = asyncio.get_running_loop().create_task(self.poll(worker))
            self._polling[name] = task
            task.add_done_callback(functools.partial(self._poll_done, name))
        self.expire()

    def _poll_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._polling.get(name) is task:
            del self._polling[name]

    def _forget(self, worker: Worker) -> None:
        self.polled_at.pop(worker.name, None)
        self.unsupported.discard(worker.name)
        self._not_found.pop(worker.name, None)
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
