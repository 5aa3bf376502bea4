"""round_robin: healthy workers in turn, skipping unhealthy ones without losing the beat."""

from __future__ import annotations

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


@register("round_robin")
class RoundRobinPolicy(PolicyDefaults):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        build_params(self.name, NoParams, config)
        self._counter = 0

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = healthy_workers(workers, request.model)
        worker = healthy[self._counter % len(healthy)]
        self._counter += 1
        return Decision(worker, "load_only")
