"""The hold queue: requests that arrive while their model has no routable worker wait here.

With ``--hold-max-requests`` above 0, a generation request whose model has no routable worker
(scaled to zero, or every replica starting) is not refused: it waits in a bounded FIFO queue
of its model, and the router signals demand (`tpuserve_router.demand`) so the fleet scales
up. The queue's head is released as soon as a worker for its model is routable; each
released request releases the next one, so requests leave in arrival order and their
streams start then. A request that arrives while others of its model wait queues behind
them even if a worker is routable by then.

Refusals are immediate and always carry ``Retry-After``: a queue at its bound refuses the
newcomer (``queue_full``); a request held ``--hold-max-seconds`` leaves with 503
(``timeout``); a router stopping refuses every held request (``shutdown``, `refuse_all`)
rather than dropping its connection. A client that goes away is removed from its queue
(``client_gone``), and the request behind it moves up. Queues are keyed by a bounded model
label (`hold_label`): the model when the router knows it, else ``other``, so neither memory
nor metric labels grow with what clients send.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final

from tpuserve_router.metrics import HOLD_OUTCOMES, RouterMetrics

HoldOutcome = str
"""One of `HOLD_OUTCOMES` (dispatched, queue_full, timeout, client_gone, shutdown)."""
OTHER_MODEL: Final = "other"
"""The queue (and label) of requests for a model the router does not know yet."""
RECHECK_SECONDS: Final = 1.0
"""How often the head of a queue looks for a routable worker by itself, should a change
not have been announced (an outlier ejection ending, say)."""


class HoldRefused(Exception):
    """A held request must be answered 503 with Retry-After; ``outcome`` says why."""

    def __init__(self, outcome: HoldOutcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def hold_label(model: str, known: Collection[str]) -> str:
    """The queue (and metric label) of ``model``: itself if known, else `OTHER_MODEL`."""
    return model if model and model in known else OTHER_MODEL


@dataclass(eq=False, slots=True)
class _Entry:
    wake: asyncio.Future[None]
    refusal: str | None = None  # set by `HoldQueues.refuse_all`


class HoldQueues:
    """Every model's hold queue. Each held request brings a ``routable()`` that says whether
    it could be routed now; `announce` is called when that may have changed."""

    def __init__(
        self,
        max_requests: int,
        max_seconds: float,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.metrics = metrics
        self.clock = clock
        self._queues: dict[str, deque[_Entry]] = {}
        self.total = 0  # requests held in every queue
        self._refusal: str | None = None  # set by `refuse_all`: every request is refused

    @property
    def enabled(self) -> bool:
        return self.max_requests > 0

    def held(self, label: str | None = None) -> int:
        """Requests waiting, in one queue or in all."""
        return self.total if label is None else len(self._queues.get(label, ()))

    def announce(self) -> None:
        """A worker may have become routable: wake the head of every queue."""
        for queue in self._queues.values():
            if queue and not queue[0].wake.done():
                queue[0].wake.set_result(None)

    def refuse_all(self, reason: str) -> None:
        """Refuse every held request, and any that comes from now on, with 503 and
        Retry-After saying ``reason`` (the router is stopping)."""
        self._refusal = reason
        for queue in self._queues.values():
            for entry in queue:
                entry.refusal = reason
                if not entry.wake.done():
                    entry.wake.set_result(None)

    async def hold(self, label: str, arrived: float, routable: Callable[[], bool]) -> None:
        """Wait until this request's turn comes with a worker routable; raises `HoldRefused`
        when the queue is full or the hold time passes. Cancelling (the client left)
        removes the request from its queue."""
        queue = self._queues.setdefault(label, deque())
        outcomes = self.metrics.hold_outcomes
        if self._refusal is not None:
            outcomes.labels(label, "shutdown").inc()
            raise HoldRefused("shutdown", self._refusal)
        if len(queue) >= self.max_requests:
            outcomes.labels(label, "queue_full").inc()
            raise HoldRefused(
                "queue_full",
                f"model {label!r} has no routable worker yet and {len(queue)} requests already "
                f"wait for one (--hold-max-requests {self.max_requests}); retry",
            )
        loop = asyncio.get_running_loop()
        entry = _Entry(loop.create_future())
        queue.append(entry)
        self.total += 1
        gauge = self.metrics.held_requests.labels(label)
        gauge.inc()
        deadline = arrived + self.max_seconds
        outcome: HoldOutcome = "client_gone"
        try:
            while True:
                if entry.refusal is not None:
                    outcome = "shutdown"
                    raise HoldRefused("shutdown", entry.refusal)
                if queue[0] is entry and routable():
                    outcome = "dispatched"
                    return
                left = deadline - self.clock()
                if left <= 0:
                    outcome = "timeout"
                    raise HoldRefused(
                        "timeout",
                        f"model {label!r} had no routable worker within {self.max_seconds:g} s "
                        "(--hold-max-seconds); retry",
                    )
                if entry.wake.done():
                    entry.wake = loop.create_future()
                await asyncio.wait((entry.wake,), timeout=min(left, RECHECK_SECONDS))
        finally:
            was_head = queue[0] is entry
            queue.remove(entry)
            self.total -= 1
            gauge.inc(-1)
            outcomes.labels(label, outcome).inc()
            self.metrics.hold_seconds.labels(label).observe(self.clock() - arrived)
            if was_head and queue and not queue[0].wake.done():
                queue[0].wake.set_result(None)  # the next one looks now
            if not queue:
                del self._queues[label]


def touch_hold_series(metrics: RouterMetrics, label: str) -> None:
    """A queue's series at zero, so `increase()` sees its first held request."""
    metrics.held_requests.labels(label)
    for outcome in HOLD_OUTCOMES:
        metrics.hold_outcomes.labels(label, outcome)
