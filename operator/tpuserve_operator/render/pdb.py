"""The PodDisruptionBudgets over a server's engine pods and over its router pods."""

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


def router_disruption_budget(server: Server) -> Manifest:
    """One voluntary eviction at a time across the router's pods, so a node drain never takes
    every replica of the router at once (with one replica it blocks nothing)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": server.metadata(server.router_name, labels.COMPONENT_ROUTER),
        "spec": {
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": {"matchLabels": labels.router_selector(server.name)},
        },
    }
