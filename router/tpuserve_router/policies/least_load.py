"""least_load: the healthy worker with the fewest in-flight requests; ties go to the first."""

from __future__ import annotations

from collections.abc import Sequence

from tpuserve_router.policies.base import LoadOnlyPolicy, W, least_loaded, register


@register("least_load")
class LeastLoadPolicy(LoadOnlyPolicy):
    def pick(self, healthy: Sequence[W]) -> W:
        return least_loaded(healthy)
