"""The fleet model's autoscaler: the HorizontalPodAutoscaler's rule and behaviour over slices.

Every ``hpa_interval_seconds`` a rule gives the desired replicas (by default the HPA's rule
on ``tokensInFlight``, KV tokens reserved per chip, `AutoscalingSpec.metric`:
``desired = ceil(replicas x metric / target)`` outside a 10 % tolerance); the bounds, then
the HorizontalPodAutoscaler's ``behavior`` (the operator's
`tpuserve_operator.scaling_behavior`, the object it renders: stabilization windows and rate
policies, `Stepper`) give the replicas. New slices start cold (`Engines.start`); removed
ones drain, a starting one first, else the least loaded.
"""

from __future__ import annotations

import math
from typing import Protocol

from tpuserve.fleet.config import FleetConfig
from tpuserve.fleet.engines import DRAINING, OFF, READY, STARTING, Engines
from tpuserve.fleet.events import Clock
from tpuserve.fleet.results import FleetResult
from tpuserve_operator.scaling_behavior import Stepper

HPA_TOLERANCE = 0.1


class Rule(Protocol):
    def desired_replicas(self, current: int) -> int:
        """The desired replica count before the bounds, given the current count."""


class Autoscaler:
    """Scales ``engines`` between ``min_replicas`` and ``replicas`` by ``rule`` (the fleet,
    whose `desired_replicas` is `tokens_in_flight_rule` unless a benchmark overrides it)."""

    def __init__(
        self,
        config: FleetConfig,
        clock: Clock,
        engines: Engines,
        result: FleetResult,
        rule: Rule,
    ) -> None:
        self.config = config
        self.clock = clock
        self.engines = engines
        self.result = result
        self.rule = rule
        self.stepper = Stepper(config.behavior)

    def tokens_in_flight_rule(self, current: int) -> int:
        """The HPA's rule on ``tokensInFlight`` (KV tokens reserved per serving chip)."""
        metric = self.engines.tokens_in_flight_per_chip()
        if metric is None:
            return current
        ratio = metric / self.config.target_tokens_per_chip
        return current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(current * ratio)

    def decide(self) -> None:
        """One HPA decision: the rule's desire within the bounds, then the behaviour's
        stabilization and rate (`Stepper`); new slices start cold, removed ones drain (a
        starting one first, else the least loaded)."""
        c = self.config
        unit = self.engines
        live = unit.live()
        current = len(live)
        lo, hi = max(1, c.min_replicas), c.replicas
        desired = max(lo, min(hi, self.rule.desired_replicas(current)))
        target = self.stepper.step(self.clock.now, current, desired, lo, hi)
        if target > current:
            for e in unit.engines:
                if current >= target:
                    break
                if e.state == OFF:
                    unit.start(e)
                    self.result.scale_ups += 1
                    current += 1
            return
        while current > target:
            victims = [e for e in live if e.state == STARTING] or [
                e for e in live if e.state == READY
            ]
            if not victims:
                return
            e = min(victims, key=lambda x: unit.load[x.i])
            live.remove(e)
            current -= 1
            self.result.scale_downs += 1
            if e.state == STARTING:
                e.incarnation += 1
                unit.set_state(e, OFF)
            else:
                unit.set_state(e, DRAINING)
                unit.maybe_off(e)
