"""The PodDisruptionBudget over a server's engine pods."""

from __future__ import annotations

from tpuserve_operator import labels
from tpuserve_operator.render.context import Manifest, Server


def disruption_budget(server: Server) -> Manifest:
    """One voluntary eviction at a time across all engine pods.

    Evicting any host breaks its whole group (the slice restarts together), and the group's
    other pods then count as unhealthy, so this lets drains take one group at a time.
    Unhealthy pods (crash-looping, never ready) may always be evicted, so a broken group
    never blocks a node drain.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": server.metadata(server.name, labels.COMPONENT_MODEL_SERVER),
        "spec": {
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": labels.engine_selector(server.name)},
        },
    }
