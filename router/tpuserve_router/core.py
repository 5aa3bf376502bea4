"""The parts every piece of the router shares: its settings, policy, workers and metrics."""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.workers import WorkerRegistry
from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.peering.peer_view import PeerLink
from tpuserve_router.policies.base import Policy


@dataclass(frozen=True, slots=True)
class RouterCore:
    """What `app.create_router_app` builds once and hands to the pipeline and the fronts."""

    config: RouterConfig
    policy: Policy
    registry: WorkerRegistry
    metrics: RouterMetrics
    peers: PeerLink | None = None
    """Where decisions, first bytes and ends are announced to peer replicas (--peer-port)."""
