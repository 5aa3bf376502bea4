"""The fleet model: hundreds of engine replicas, several routers, a day's traffic, on one
virtual clock (`tpuserve.fleet.model` states every rule). `tpuserve plan` sizes fleets with
it and the ``bench/fleet_*`` scripts measure with it, both through these names."""

from tpuserve.fleet.model import (
    BLOCK_TOKENS,
    FLEET_POLICIES,
    READY,
    WORKLOADS,
    FleetConfig,
    FleetResult,
    FleetSim,
    WorkloadRequest,
    add_peering_arguments,
    daily_multiplier,
    peer_delay_from,
    run_fleet,
)

__all__ = [
    "BLOCK_TOKENS",
    "FLEET_POLICIES",
    "READY",
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
