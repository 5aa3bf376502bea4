"""The fleet model: hundreds of engine replicas, several routers, a day's traffic, on one
virtual clock (`tpuserve.fleet.model` maps its parts, each module states its rules).
`tpuserve plan` sizes fleets with it and the ``bench/fleet_*`` scripts measure with it, both
through these names."""

from tpuserve.fleet.config import (
    BLOCK_TOKENS,
    FLEET_POLICIES,
    WORKLOADS,
    FleetConfig,
    WorkloadRequest,
    add_peering_arguments,
    daily_multiplier,
    peer_delay_from,
)
from tpuserve.fleet.engines import READY, STARTING
from tpuserve.fleet.model import FleetSim, run_fleet
from tpuserve.fleet.results import FleetResult

__all__ = [
    "BLOCK_TOKENS",
    "FLEET_POLICIES",
    "READY",
    "STARTING",
    "WORKLOADS",
    "FleetConfig",
    "FleetResult",
    "FleetSim",
    "WorkloadRequest",
    "add_peering_arguments",
    "daily_multiplier",
    "peer_delay_from",
    "run_fleet",
]
