"""round_robin: healthy workers in turn, skipping unhealthy ones without losing the beat."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpuserve_router.policies.base import LoadOnlyPolicy, W, register


@register("round_robin")
class RoundRobinPolicy(LoadOnlyPolicy):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.turn = 0

    def pick(self, healthy: Sequence[W]) -> W:
        worker = healthy[self.turn % len(healthy)]
        self.turn += 1
        return worker
