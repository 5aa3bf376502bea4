"""Scale to zero: the demand Lease, the router's hold flags, and the Role rule to renew it.

A server with ``autoscaling.minReplicas: 0`` gets a Lease (``<name>-demand``). Its routers
hold requests while no replica is routable and renew the Lease's ``spec.renewTime`` while
requests arrive, run or wait (`tpuserve_router.tenancy.demand`); the operator reads it from its
watch (`scale_to_zero`). The Lease is the operator's child; a router's Role may only ``get``
and ``patch`` that one object (``resourceNames``), the least a router needs to say "there
is demand" in one API call. docs/operator.md ("Scale to zero") says why this and not the
HPA or Prometheus.
"""

from __future__ import annotations

from typing import Any, Final

from tpuserve_operator import labels
from tpuserve_operator.render.context import Manifest, Server

LEASE_API_VERSION: Final = "coordination.k8s.io/v1"
DEMAND_INTERVAL_SECONDS: Final = 5
"""How often a router renews the Lease while there is demand (`--demand-interval`)."""
FRESH_RENEWALS: Final = 3
"""A renewal this many intervals old still counts as demand now (a missed write or two)."""


def scales_to_zero(server: Server) -> bool:
    """minReplicas 0: the server's routers, or a TPUGateway in front of it (without a router
    of its own; the reconciler checks one selects it: `gateway_problem`), renew its Lease."""
    autoscaling = server.valid.spec.autoscaling
    return autoscaling is not None and autoscaling.min_replicas == 0


GATEWAY_NEEDED = (
    "0 needs someone to hold the requests that arrive at zero replicas and signal the "
    "demand: spec.router.enabled true, or a TPUGateway of the namespace whose serverSelector "
    "selects this server (none does); allowed with neither: 1 or more"
)


def needs_gateway(spec: Any) -> bool:
    """A spec (JSON) that scales to zero with no router of its own: only a TPUGateway can
    hold its requests and renew its Lease."""
    router = spec.get("router") or {}
    autoscaling = spec.get("autoscaling") or {}
    return router.get("enabled", True) is False and autoscaling.get("minReplicas", 1) == 0


def demand_lease_name(server: Server) -> str:
    return f"{server.name}-demand"


def demand_lease(server: Server) -> list[Manifest]:
    """The Lease the routers renew, or none without scale to zero."""
    if not scales_to_zero(server):
        return []
    return [
        {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": server.metadata(demand_lease_name(server), labels.COMPONENT_ROUTER),
            "spec": {"leaseDurationSeconds": DEMAND_INTERVAL_SECONDS * FRESH_RENEWALS},
        }
    ]


def hold_args(server: Server) -> list[str]:
    """The router's flags for holding requests and renewing the Lease."""
    if not scales_to_zero(server):
        return []
    hold = server.valid.spec.router.hold
    return [
        f"--hold-max-requests={hold.max_requests}",
        f"--hold-max-seconds={hold.max_seconds}",
        f"--hold-models={server.valid.served_name}",
        f"--demand-lease={demand_lease_name(server)}",
        f"--demand-interval={DEMAND_INTERVAL_SECONDS}",
    ]


def lease_rule(server: Server) -> list[dict[str, Any]]:
    """The router Role's rule for its one Lease (resourceNames: nothing else)."""
    if not scales_to_zero(server):
        return []
    return [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [demand_lease_name(server)],
            "verbs": ["get", "patch"],
        }
    ]
