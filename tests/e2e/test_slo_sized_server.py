"""A server sized from an SLO on a real control plane: given only spec.slo and spec.demand, the
operator (told the cluster's slices, --plan-slices) plans its slice and replicas, writes them
to status.plan and brings up the replica groups' pods on the planned node pool; a higher
demand is planned again; a user's slice wins."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import slo_sizing
from tests.e2e.tms_harness import (
    OperatorProcess,
    apply,
    engine_pods,
    run_operator,
    tms,
    wait_until,
)
from tpuserve.cluster import Cluster
from tpuserve_operator import labels

pytestmark = pytest.mark.e2e

PLAN_SLICES = "v6e:2x4"  # the default profile's single-host v6e pool (4 nodes)


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log_dir = tmp_path_factory.mktemp("operator-slo")
    yield from run_operator(
        cluster, operator_kubeconfig, log_dir, "--workload", "statefulset",
        "--plan-slices", PLAN_SLICES,
    )  # fmt: skip


def slo_server(name: str, rate: float, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {
                "source": "hf://Qwen/Qwen3-8B",
                "quantization": "fp8",
                "contextLength": 8192,
            },
            "slo": {"ttftP99Seconds": 1, "itlP99Seconds": 0.05},
            "demand": {"requestsPerSecond": rate, "promptTokens": 2000, "outputTokens": 500},
            **spec,
        },
    }


def plan_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = tms(cluster, namespace, name)
    plan: dict[str, Any] = (body.get("status") or {}).get("plan") or {}
    plan["_generation"] = body["metadata"]["generation"]
    return plan


def ready_pods(cluster: Cluster, namespace: str, name: str) -> int:
    return sum(
        1
        for p in engine_pods(cluster, namespace, name)
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions") or []
        )
    )


def test_a_server_given_only_an_slo_and_a_demand_gets_status_plan_and_pods(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, slo_server("sized", 20))

    def planned() -> dict[str, Any]:
        plan = plan_of(cluster, namespace, "sized")
        assert plan.get("observedGeneration") == plan["_generation"]
        return plan

    plan = wait_until("status.plan of sized", planned, operator)
    assert plan["source"] == "Planned"
    assert (plan["generation"], plan["topology"]) == ("v6e", "2x4")
    point = plan["operatingPoint"]
    replicas = plan["maxReplicas"]
    assert replicas == math.ceil(20 / point["requestsPerSecond"])
    assert point["ttftP99Seconds"] <= 1
    assert point["itlSeconds"] <= 0.05
    assert point["concurrency"] > 0
    error, ttft = slo_sizing.PERF_MODEL_ERROR, slo_sizing.TTFT_P99_ERROR  # the validations'
    assert plan["errorBand"] == {
        "median": error["median"], "worst": error["worst"], "figures": error["rows"],
        "ttftP99Low": ttft["low"], "ttftP99High": ttft["high"],
    }  # fmt: skip
    # the planned replica groups' pods run on the planned slice's nodes
    wait_until(
        f"{replicas} ready engine pods of sized",
        lambda: ready_pods(cluster, namespace, "sized") == replicas,
        operator,
    )
    for pod in engine_pods(cluster, namespace, "sized"):
        selector = pod["spec"]["nodeSelector"]
        assert selector["cloud.google.com/gke-tpu-topology"] == "2x4"
        assert selector["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"

    # a higher demand is planned again: more replicas, and their pods
    patch = {"spec": {"demand": {"requestsPerSecond": 40}}}
    cluster.kubectl("patch", "tms", "sized", "-n", namespace, "--type", "merge",
                    "-p", json.dumps(patch))  # fmt: skip

    def planned_again() -> dict[str, Any]:
        plan = planned()
        assert plan["maxReplicas"] > replicas
        return plan

    again = wait_until("sized planned again", planned_again, operator)
    assert again["observedGeneration"] > plan["observedGeneration"]
    wait_until(
        f"{again['maxReplicas']} ready engine pods of sized",
        lambda: ready_pods(cluster, namespace, "sized") == again["maxReplicas"],
        operator,
    )


def test_a_users_slice_wins_over_the_plan(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, slo_server("mine", 20, tpu={"generation": "v5e", "topology": "2x4"}))

    def planned() -> dict[str, Any]:
        plan = plan_of(cluster, namespace, "mine")
        assert plan.get("operatingPoint")
        return plan

    plan = wait_until("status.plan of mine", planned, operator)
    assert plan["source"] == "Spec"
    assert (plan["generation"], plan["topology"]) == ("v5e", "2x4")
    assert plan["maxReplicas"] >= 1
