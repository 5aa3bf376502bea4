"""`spec.kvCache.host` on a real kube-apiserver: the operator's pods get the host tier's launch
contract (and from it SGLang's --enable-hierarchical-cache flags) and memory that holds it; a
tier too large for the machine type is refused by the apiserver's CEL, and reported Valid=False
naming the field and the largest size allowed (docs/host-kv-tier.md). The admission policy's
refusal at `kubectl apply` is checked with the docs' `# refused:` example in test_admission.py."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_tpu import hicache
from sglang_tpu.topology import lookup
from tests.e2e.tms_harness import (
    OperatorProcess,
    apply,
    condition,
    engine_pods,
    server,
    wait_condition,
    wait_until,
)
from tpuserve.cluster import Cluster, CommandError
from tpuserve_operator import engine_resources

pytestmark = pytest.mark.e2e

ONE_KIND = pytest.mark.parametrize("operator", ["statefulset"], indirect=True)


@ONE_KIND
def test_pods_get_the_tiers_flags_and_memory(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    host = {"sizeGB": 30, "writePolicy": "write_back"}
    manifest = server("host-tier", "v5e", "2x4", kvCache={"host": host})
    apply(cluster, namespace, manifest)
    wait_condition(cluster, namespace, "host-tier", "Valid", "True", operator)
    pods: list[dict[str, Any]] = []

    def scheduled() -> bool:
        pods[:] = engine_pods(cluster, namespace, "host-tier")
        return len(pods) == 1

    wait_until("host-tier: its engine pod", scheduled, operator)
    (container,) = pods[0]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TPUSERVE_HOST_KV_CACHE"] == "write_back"
    assert env["TPUSERVE_HOST_KV_SIZE_GB"] == "30"
    memory = container["resources"]["limits"]["memory"]
    assert container["resources"]["requests"]["memory"] == memory
    limit = float(engine_resources.quantity(memory) or 0)
    shape = lookup("v5e", "2x4")
    assert hicache.pool_budget_bytes(limit) >= 30 * hicache.GB * hicache.ranks_per_host(shape)


@ONE_KIND
def test_a_tier_too_large_is_reported_naming_the_largest_size(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    both = server("host-both", "v5e", "2x4", kvCache={"host": {"sizeGB": 10, "ratio": 2.0}})
    with pytest.raises(CommandError) as refused:
        apply(cluster, namespace, both)
    assert "one of sizeGB and ratio" in str(refused.value.stderr)
    # No admission policy in this cluster (test_admission.py installs it): the operator judges.
    apply(cluster, namespace, server("host-big", "v5e", "2x4", kvCache={"host": {"sizeGB": 42}}))
    body = wait_condition(
        cluster, namespace, "host-big", "Valid", "False", operator, reason="HostKvCacheDoesNotFit"
    )
    valid = condition(body, "Valid")
    assert "spec.kvCache.host.sizeGB: 42 GB per rank" in valid["message"]
    assert valid["message"].endswith("allowed: at most 41")
    assert engine_pods(cluster, namespace, "host-big") == []
