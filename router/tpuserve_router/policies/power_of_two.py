"""power_of_two: sample two distinct healthy workers at random, send to the less loaded one.

As sglang-router's `power_of_two`, but the load is the router's own in-flight count (which
every request updates) rather than a periodically polled engine load, so two routers'
decisions never act on a stale reading. With one healthy worker it is chosen directly.
"""

from __future__ import annotations

import random as _random
import time
from collections.abc import Sequence
from typing import Any

from tpuserve_router.policies.base import (
    Clock,
    Decision,
    NoParams,
    PolicyDefaults,
    RouteRequest,
    W,
    build_params,
    healthy_workers,
    register,
)


@register("power_of_two")
class PowerOfTwoPolicy(PolicyDefaults):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        build_params(self.name, NoParams, config)
        self._rng = _random.Random(seed)

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = healthy_workers(workers, request.model)
        if len(healthy) == 1:
            return Decision(healthy[0], "load_only")
        first, second = self._rng.sample(healthy, 2)
        return Decision(first if first.in_flight <= second.in_flight else second, "load_only")
