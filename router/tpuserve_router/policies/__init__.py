"""Routing policies, one module each; importing this package registers all of them."""

from tpuserve_router.policies import (  # noqa: F401  (imported to register)
    cache_aware,
    cost,
    least_load,
    power_of_two,
    precise,
    random,
    round_robin,
)
from tpuserve_router.policies.base import (
    OUTCOMES,
    Clock,
    Decision,
    NoHealthyWorker,
    Outcome,
    Policy,
    PolicyConfigError,
    PolicyDefaults,
    RouteRequest,
    WorkerView,
    make_policy,
    register,
    registered_policy_names,
)

__all__ = [
    "OUTCOMES",
    "Clock",
    "Decision",
    "NoHealthyWorker",
    "Outcome",
    "Policy",
    "PolicyConfigError",
    "PolicyDefaults",
    "RouteRequest",
    "WorkerView",
    "make_policy",
    "register",
    "registered_policy_names",
]
