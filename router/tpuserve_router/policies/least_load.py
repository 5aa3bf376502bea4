"""least_load: the healthy worker with the fewest in-flight requests; ties go to the first."""

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
    least_loaded,
    register,
)


@register("least_load")
class LeastLoadPolicy(PolicyDefaults):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        build_params(self.name, NoParams, config)

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        return Decision(least_loaded(healthy_workers(workers, request.model)), "load_only")
