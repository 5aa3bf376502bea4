"""random: a uniformly random healthy worker (seeded, so a benchmark can replay it)."""

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


@register("random")
class RandomPolicy(PolicyDefaults):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        build_params(self.name, NoParams, config)
        self._rng = _random.Random(seed)

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = healthy_workers(workers, request.model)
        return Decision(self._rng.choice(healthy), "load_only")
