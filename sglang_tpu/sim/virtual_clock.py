"""The virtual-clock driver of the engine core: benchmarks run hours of traffic in seconds.

Virtual-clock API (what a benchmark uses)::

    core = EngineCore(EngineConfig(cache_tokens=200_000, page_size=16), timer, palette)
    sim = VirtualEngine(core)
    sim.submit(Request("r1", token_ids, max_new_tokens=64), at=0.0)
    done = sim.run_until(10.0)            # list[Completion]: ttft, e2e, cached_tokens, ...
    core.match_prefix_length(token_ids)   # oracle view of the cache, no side effects
    core.num_running, core.num_waiting, core.token_usage
"""

from __future__ import annotations

import heapq
import math

from sglang_tpu.sim.engine import EngineCore, QueueFull, Step
from sglang_tpu.sim.request import Completion, Request


class VirtualEngine:
    """Drives an EngineCore on a virtual clock: submit arrivals, advance, read completions."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0
        self._arrivals: list[tuple[float, int, Request]] = []
        self._seq = 0
        self._step: Step | None = None
        self._step_end = math.inf
        self.rejected: list[tuple[float, Request]] = []

    def submit(self, req: Request, at: float) -> None:
        """Schedule `req` to arrive at virtual time `at` (not before the current time)."""
        self._seq += 1
        heapq.heappush(self._arrivals, (max(at, self.now), self._seq, req))

    @property
    def idle(self) -> bool:
        return not self._arrivals and self._step is None and not self.core.has_work()

    def run_until(self, until: float) -> list[Completion]:
        """Advance to `until` (or the last event before it); completions finished meanwhile."""
        core = self.core
        arrivals = self._arrivals
        done: list[Completion] = []
        while True:
            while arrivals and arrivals[0][0] <= self.now:
                at, _, req = heapq.heappop(arrivals)
                try:
                    core.add_request(req, at)
                except QueueFull:
                    self.rejected.append((at, req))
            if self._step is None and core.has_work():
                step = core.begin_step(self.now)
                if step is not None:
                    self._step = step
                    self._step_end = self.now + step.duration
            next_arrival = arrivals[0][0] if arrivals else math.inf
            next_time = min(next_arrival, self._step_end)
            if next_time > until or next_time == math.inf:
                if until != math.inf:
                    self.now = max(self.now, until)
                return done
            self.now = next_time
            if self._step is not None and self._step_end <= next_arrival:
                step, self._step, self._step_end = self._step, None, math.inf
                for req in core.finish_step(step, self.now):
                    done.append(req.completion())

    def run_to_completion(self) -> list[Completion]:
        return self.run_until(math.inf)
