"""random: a uniformly random healthy worker (seeded, so a benchmark can replay it)."""

from __future__ import annotations

from collections.abc import Sequence

from tpuserve_router.policies.base import LoadOnlyPolicy, W, register


@register("random")
class RandomPolicy(LoadOnlyPolicy):
    def pick(self, healthy: Sequence[W]) -> W:
        return self.rng.choice(healthy)
