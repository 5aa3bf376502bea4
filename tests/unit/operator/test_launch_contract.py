"""Every replica group's launch contract comes from group 0's, validated once: for every
group index the API allows, it equals what the contract's own validation gives."""

from __future__ import annotations

import pytest

from tpuserve_operator import launch_contract
from tpuserve_operator.api import MAX_NAME_LENGTH
from tpuserve_operator.render import RenderConfig, validate_server
from tpuserve_operator.render.pod import engine_image, pod_paths, termination
from tpuserve_operator.render.workload import group_hostnames

pytestmark = pytest.mark.unit

LONGEST_NAME = "q" * MAX_NAME_LENGTH
LONGEST_NAMESPACE = "n" * 63
MAX_REPLICAS = MAX_SURGE = 1024


@pytest.mark.parametrize("leaderworkerset", [False, True], ids=["statefulset", "lws"])
@pytest.mark.parametrize("topology", ["2x4", "4x4"], ids=["one-host", "four-hosts"])
def test_a_groups_contract_is_what_validation_would_give(
    leaderworkerset: bool, topology: str
) -> None:
    spec = {
        "model": {"source": "hf://Qwen/Qwen3-8B"},
        "tpu": {"generation": "v6e", "topology": topology},
        "replicas": MAX_REPLICAS,
        "rollout": {"maxSurge": MAX_SURGE},
    }
    meta = {"name": LONGEST_NAME, "namespace": LONGEST_NAMESPACE}
    server = validate_server(meta, spec, RenderConfig(leaderworkerset=leaderworkerset))
    for replica in (0, 1, 10, MAX_REPLICAS + MAX_SURGE - 1):
        hostnames = group_hostnames(server, replica)
        derived = launch_contract.for_replica(server.contract, replica, hostnames)
        validated = launch_contract.group_contract(
            server.valid.spec,
            served_name=server.valid.served_name,
            replica=replica,
            hostnames=hostnames,
            paths=pod_paths(server),
            drain_timeout_seconds=termination(server).drain_seconds,
            engine_version=engine_image(server),
        )
        assert derived == validated
        assert derived.to_env() == validated.to_env()
        assert derived.replica_index == replica
