"""The fleet model's virtual clock: one heap of events every part schedules on."""

from __future__ import annotations

import heapq
from typing import Any

# Event kinds (heap entries are (time, seq, kind, a, b)).
STEP, ARRIVAL, SESSION, POLL, HPA, UP, NOTICE, KILL, SAMPLE = range(9)


class Clock:
    """The time now and the events to come, in (time, order scheduled) order: the parts
    share one, so an event's place in the run does not depend on which part scheduled it."""

    __slots__ = ("events", "now", "seq")

    def __init__(self) -> None:
        self.events: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.now = 0.0

    def push(self, t: float, kind: int, a: Any, b: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))
