"""Outlier ejection (passive health, as Envoy's outlier detection): a worker that fails real
requests leaves the rotation for a while, longer each time it does.

Every request's outcome on a worker is reported: a *failure* is a 5xx answer, a timeout, a
refused, reset or broken connection, a stalled stream or an oversized answer; anything else
is a success (a 4xx is the client's doing). Two rules eject a worker:

- consecutive failures: ``consecutive_failures`` in a row (Envoy's ``consecutive_5xx``);
- failure rate: in the current window of ``interval_seconds``, at least ``min_requests``
  outcomes of which a share of at least ``failure_rate`` failed (Envoy's
  ``failure_percentage``), checked at every failure so a fast-failing worker goes at once.

An ejected worker is out for ``base_ejection_seconds × n``, n being its ejections (one less
for every interval it has since spent in rotation), at most ``max_ejection_seconds``; it then
returns by itself (`release_due`). A passing health probe does not bring it back (a worker
that answers 500 to everything while ``/health`` passes would be back at every probe),
unless a probe failed since the ejection: then the worker was down and is back, e.g.
restarted (`Worker.health_check_passed`). At most ``max_ejected_percent`` of the workers
are ejected at once (at least one may be), so a fleet-wide failure (a bad rollout, a client
sending poison) does not empty the rotation. Cost per request: a few integer updates on
the worker; no clock is read unless a worker fails.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tpuserve_router.config import RouterConfig
from tpuserve_router.labels import EJECTION_REASONS as EJECTION_REASONS


@dataclass(frozen=True)
class OutlierConfig:
    """The ejection rules' parameters (`outlier_config`: the router's settings)."""

    consecutive_failures: int
    failure_rate: float
    min_requests: int
    interval_seconds: float
    base_ejection_seconds: float
    max_ejection_seconds: float
    max_ejected_percent: float


def outlier_config(config: RouterConfig) -> OutlierConfig:
    """The ejection rules' parameters the router's settings give."""
    return OutlierConfig(
        consecutive_failures=config.outlier_consecutive_failures,
        failure_rate=config.outlier_failure_rate,
        min_requests=config.outlier_min_requests,
        interval_seconds=config.outlier_interval_seconds,
        base_ejection_seconds=config.outlier_base_ejection_seconds,
        max_ejection_seconds=config.outlier_max_ejection_seconds,
        max_ejected_percent=config.outlier_max_ejected_percent,
    )


class Ejectable(Protocol):
    """The outlier state a worker carries (`workers.Worker`)."""

    name: str
    ejected: bool
    ejected_until: float
    ejections: int
    returned_at: float
    consecutive_failures: int
    window_requests: int
    window_failures: int

    def set_ejected(self, ejected: bool) -> None: ...


class OutlierDetector:
    """Applies the rules to reported outcomes; `start` runs its clock (windows, returns)."""

    def __init__(
        self,
        config: OutlierConfig,
        workers: Callable[[], Sequence[Ejectable]],
        on_ejected: Callable[[Ejectable, str], None] = lambda worker, reason: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.workers = workers
        self.on_ejected = on_ejected
        self.clock = clock
        self._window_started = clock()
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ outcomes

    def succeeded(self, worker: Ejectable) -> None:
        worker.window_requests += 1
        worker.consecutive_failures = 0

    def failed(self, worker: Ejectable) -> None:
        worker.window_requests += 1
        worker.window_failures += 1
        worker.consecutive_failures += 1
        if worker.ejected:
            return
        config = self.config
        if worker.consecutive_failures >= config.consecutive_failures:
            self._eject(worker, "consecutive_failures")
        elif (
            worker.window_requests >= config.min_requests
            and worker.window_failures >= config.failure_rate * worker.window_requests
        ):
            self._eject(worker, "failure_rate")

    # ------------------------------------------------------------------ time

    def release_due(self, now: float) -> None:
        """Return every worker whose ejection is over; start a new window when one is due."""
        for worker in self.workers():
            if worker.ejected and now >= worker.ejected_until:
                worker.returned_at = now
                worker.consecutive_failures = 0
                worker.set_ejected(False)
        if now - self._window_started >= self.config.interval_seconds:
            self._window_started = now
            for worker in self.workers():
                worker.window_requests = worker.window_failures = 0

    def start(self) -> None:
        tick = min(1.0, self.config.interval_seconds)
        loop = asyncio.get_running_loop()

        def run() -> None:
            self.release_due(self.clock())
            self._timer = loop.call_later(tick, run)

        self._timer = loop.call_later(tick, run)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ ejection

    def _eject(self, worker: Ejectable, reason: str) -> None:
        config = self.config
        workers = self.workers()
        allowed = max(1, math.floor(len(workers) * config.max_ejected_percent / 100))
        if sum(1 for w in workers if w.ejected) >= allowed:
            return
        now = self.clock()
        if worker.ejections:  # one fewer for every interval spent in rotation since
            in_rotation = int((now - worker.returned_at) / config.interval_seconds)
            worker.ejections = max(0, worker.ejections - in_rotation)
        worker.ejections += 1
        seconds = min(config.base_ejection_seconds * worker.ejections, config.max_ejection_seconds)
        worker.ejected_until = now + seconds
        worker.set_ejected(True)
        self.on_ejected(worker, reason)
