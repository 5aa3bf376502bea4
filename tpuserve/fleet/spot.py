"""Spot preemptions in the fleet model: notice, then the slice dies and comes back cold.

Preemptions hit each live slice as a Poisson process of ``preemptions_per_replica_hour``;
after ``preemption_notice_seconds`` (GKE's 30 s) the slice dies, its unfinished requests fail
and it comes back after a cold start (the StatefulSet's pod on a new node).
"""

from __future__ import annotations

import random

from tpuserve.fleet.config import FleetConfig
from tpuserve.fleet.engines import DRAINING, NOTICED, READY, Engine, Engines
from tpuserve.fleet.events import KILL, NOTICE, Clock
from tpuserve.fleet.results import FleetResult


class Spot:
    """Preempts ``engines``' slices; ``rng`` is the fleet's (shared with traffic and cold
    starts)."""

    def __init__(
        self,
        config: FleetConfig,
        clock: Clock,
        rng: random.Random,
        engines: Engines,
        result: FleetResult,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng
        self.engines = engines
        self.result = result

    def schedule(self, e: Engine) -> None:
        """The slice serves from now: draw when it is preempted (no Spot: never)."""
        rate = self.config.preemptions_per_replica_hour
        if rate > 0:
            at = self.clock.now + self.rng.expovariate(rate / 3600.0)
            self.clock.push(at, NOTICE, e.i, e.incarnation)

    def notice(self, i: int, incarnation: int) -> None:
        """The preemption notice reaches slice ``i`` (if it is still that incarnation)."""
        e = self.engines.engines[i]
        if e.incarnation == incarnation and e.state in (READY, DRAINING):
            self.engines.set_state(e, NOTICED)
            self.clock.push(
                self.clock.now + self.config.preemption_notice_seconds, KILL, i, incarnation
            )

    def kill(self, i: int, incarnation: int) -> None:
        """The notice ran out: the slice dies and its pod comes back on a new node."""
        e = self.engines.engines[i]
        if e.incarnation == incarnation and e.state == NOTICED:
            self.result.preemptions += 1
            self.engines.kill(e)
            self.engines.start(e)
