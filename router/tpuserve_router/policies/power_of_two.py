"""power_of_two: sample two distinct healthy workers at random, send to the less loaded one.

As sglang-router's `power_of_two`, but the load is the router's own in-flight count (which
every request updates) rather than a periodically polled engine load, so two routers'
decisions never act on a stale reading. With one healthy worker it is chosen directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuserve_router.policies.base import LoadOnlyPolicy, W, register


@register("power_of_two")
class PowerOfTwoPolicy(LoadOnlyPolicy):
    def pick(self, healthy: Sequence[W]) -> W:
        if len(healthy) == 1:
            return healthy[0]
        first, second = self.rng.sample(healthy, 2)
        return first if first.in_flight <= second.in_flight else second
