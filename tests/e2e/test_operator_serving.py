"""Valid TPUModelServers are served on the matching fake GKE pools and reach Ready; invalid
ones are refused by the apiserver (CEL) or reported Valid=False with an Event and no children.

Issue 6, items 2 and 3. Each workload kind (LeaderWorkerSet, StatefulSets) serves a multi-host
and a single-host slice (`CASES`); every catalog shape with both kinds is rendered and checked by
tests/unit/operator/test_render_catalog.py. What the apiserver or the operator refuses does not
depend on the kind: those tests run with one operator (`ONE_KIND`). Issue 48: what `tpuserve
plan --emit` writes is applied unchanged and accepted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tpu.topology import (
    ACCELERATOR_LABEL,
    NODE_POOL_LABEL,
    TOPOLOGY_LABEL,
    TPU_RESOURCE,
    lookup,
)
from tests.e2e.tms_harness import (
    REPO,
    OperatorProcess,
    apply,
    children,
    condition,
    engine_pods,
    get,
    server,
    tms,
    wait_condition,
    wait_until,
    workload_kind,
)
from tpuserve.cluster import Cluster, CommandError
from tpuserve_operator import labels
from tpuserve_operator.render.autoscaler import TOKENS_IN_FLIGHT_METRIC

pytestmark = pytest.mark.e2e

# (operator's --workload, name, generation, topology, replicas, extra spec): each fits the
# default pools at once. Per kind a multi-host slice with two groups (each group on a pool of its
# own) and a single-host one; Ironwood's 2x2x2 slice runs with both kinds in
# test_operator_lifecycle.py (a group restart), the twin in the living-cluster tests.
CASES: list[tuple[str, str, str, str, int, dict[str, Any]]] = [
    ("leaderworkerset", "v6e-4x4", "v6e", "4x4", 2, {}),  # 4 hosts
    ("leaderworkerset", "v6e-2x4", "v6e", "2x4", 2, {}),  # 1 host
    ("statefulset", "v6e-4x4", "v6e", "4x4", 2, {}),
    ("statefulset", "v5e-spot", "v5e", "2x4", 1, {"tpu": {"spot": True}}),  # 1 host
    ("statefulset", "simulated", "v6e", "4x4", 1, {"engine": "simulated"}),  # no TPU
]
PLANNED = sorted(REPO.glob("bench/fleet_results/*/plan-*.yaml"))
"""The TPUModelServers `tpuserve plan --emit` wrote for docs/capacity-planning.md's cases."""
PLAN_TIMEOUT_SECONDS = 120.0
# The kind of the operator that the kind-independent tests run with.
ONE_KIND = pytest.mark.parametrize("operator", ["statefulset"], indirect=True)


def _node_labels(cluster: Cluster) -> dict[str, dict[str, str]]:
    nodes = get(cluster, "default", "nodes")["items"]
    return {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}


@pytest.mark.parametrize(
    ("operator", "name", "generation", "topology", "replicas", "extra"),
    CASES,
    ids=[f"{c[1]}-{c[0]}" for c in CASES],
    indirect=["operator"],
)
def test_valid_servers_are_scheduled_on_their_slices_and_become_ready(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    name: str,
    generation: str,
    topology: str,
    replicas: int,
    extra: dict[str, Any],
) -> None:
    manifest = server(name, generation, topology, replicas=replicas, **extra)
    simulated = manifest["spec"]["engine"]["type"] == "simulated"
    apply(cluster, namespace, manifest)
    body = wait_condition(cluster, namespace, name, "Ready", "True", operator)
    wait_until(
        f"{name}: {replicas} ready replica groups",
        lambda: (
            (tms(cluster, namespace, name).get("status") or {}).get("readyReplicas") == replicas
        ),
        operator,
    )
    body = tms(cluster, namespace, name)
    status = body["status"]
    shape = lookup(generation, topology)
    assert status["replicas"] == replicas
    assert status["updatedReplicas"] == replicas
    assert status["endpoint"] == f"http://{name}.{namespace}.svc:8000"
    assert status["plan"]["workload"] == workload_kind(operator)
    assert status["plan"]["hosts"] == shape.hosts
    assert condition(body, "Valid")["reason"] == "SpecValid"
    assert condition(body, "Degraded")["status"] == "False"

    pods = engine_pods(cluster, namespace, name)
    assert len(pods) == replicas * shape.hosts
    nodes = _node_labels(cluster)
    pools_by_group: dict[str, set[str]] = {}
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        node = nodes[pod["spec"]["nodeName"]]
        (container,) = pod["spec"]["containers"]
        requests = container.get("resources", {}).get("requests", {})
        if simulated:
            assert TPU_RESOURCE not in requests
            assert ACCELERATOR_LABEL not in node
        else:
            assert requests[TPU_RESOURCE] == str(shape.chips_per_host)
            assert {"cpu", "memory"} <= set(requests)  # from the catalog, and they fit the node
            assert node[ACCELERATOR_LABEL] == shape.generation.accelerator
            assert node[TOPOLOGY_LABEL] == topology
            group = pod["metadata"]["labels"][labels.SLICE_GROUP]
            pools_by_group.setdefault(group, set()).add(node[NODE_POOL_LABEL])
    if shape.multi_host and not simulated:
        # one slice per group: all its hosts in one pool, and no pool shared by two groups
        assert all(len(pools) == 1 for pools in pools_by_group.values()), pools_by_group
        used = [next(iter(p)) for p in pools_by_group.values()]
        assert len(set(used)) == len(used)

    table = cluster.kubectl("get", "tms", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "MODEL",
        "TPU",
        "TOPOLOGY",
        "REPLICAS",
        "READY",
        "ENDPOINT",
        "AGE",
    ]
    row = table[1].split()
    assert row[:6] == [name, "qwen3-8b", generation, topology, str(replicas), str(replicas)]
    assert row[6] == status["endpoint"]


@ONE_KIND
def test_the_apiserver_refuses_what_cel_can_see(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    bad = server("bad", "tpu7x", "2x2", model="s3://bucket/model")
    bad["spec"]["engine"]["speculative"] = {"algorithm": "EAGLE3"}
    bad["spec"]["autoscaling"] = {"minReplicas": 4, "maxReplicas": 2}
    with pytest.raises(CommandError) as refused:
        apply(cluster, namespace, bad)
    message = refused.value.stderr
    assert "spec.tpu" in message
    assert "three dimensions" in message
    assert "spec.model" in message
    assert "hf://ORG/NAME" in message
    assert "spec.engine.speculative" in message
    assert "draftModel is required" in message
    assert "spec.autoscaling" in message
    negative = server("neg", "v6e", "4x4", replicas=-1)
    with pytest.raises(CommandError) as refused_replicas:
        apply(cluster, namespace, negative)
    assert "spec.replicas" in refused_replicas.value.stderr


@ONE_KIND
def test_catalog_invalid_servers_get_valid_false_an_event_and_no_children(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, server("odd", "v6e", "3x3"))
    body = wait_condition(
        cluster, namespace, "odd", "Valid", "False", operator, reason="UnsupportedTopology"
    )
    message = condition(body, "Valid")["message"]
    assert "spec.tpu.topology" in message
    assert "'3x3'" in message
    assert "4x4" in message

    def event_posted() -> bool:
        events = get(cluster, namespace, "events")["items"]
        return any(
            e.get("reason") == "UnsupportedTopology"
            and e.get("type") == "Warning"
            and e["involvedObject"].get("name") == "odd"
            for e in events
        )

    wait_until("a Warning event for odd", event_posted, operator)
    assert children(cluster, namespace, "odd") == {}
    assert condition(body, "Ready")["status"] == "False"


@ONE_KIND
def test_a_model_that_does_not_fit_is_reported(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    big = server("big", "v5e", "2x4", model="hf://Qwen/Qwen3-235B-A22B")
    big["spec"]["model"]["quantization"] = "none"
    apply(cluster, namespace, big)
    body = wait_condition(
        cluster, namespace, "big", "Valid", "False", operator, reason="ModelDoesNotFit"
    )
    assert "does not fit v5e/2x4" in condition(body, "Valid")["message"]
    assert children(cluster, namespace, "big") == {}


@ONE_KIND
def test_planned_servers_are_applied_unchanged_and_accepted(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """`tpuserve plan --emit` on a small case (one slice, one simulated replica, a 20-s
    window: about a second of CPU), plus the three cases' committed manifests: each file is
    applied as written, the operator finds it valid and renders the server, with the
    autoscaler the plan asked for (the fake TPU nodes need not run its pods)."""
    emitted = tmp_path / "planned.yaml"
    plan = [sys.executable, "-m", "tpuserve", "plan", "--model", "llama-3.1-8b",
            "--preset", "chat", "--rate", "20", "--generations", "v6e", "--topologies", "2x4",
            "--sim-replicas", "1", "--window", "20", "--emit", str(emitted),
            "--name", "e2e-plan"]  # fmt: skip
    done = subprocess.run(plan, capture_output=True, text=True, timeout=PLAN_TIMEOUT_SECONDS)
    assert done.returncode == 0, done.stderr
    # the same case planned as prefill and decode roles (simulated engines: SGLang has no TPU
    # transfer backend)
    disaggregated = tmp_path / "planned-pd.yaml"
    plan_pd = [*plan[: plan.index("--emit")], "--disaggregate", "--engine", "simulated",
               "--emit", str(disaggregated), "--name", "e2e-pd-plan"]  # fmt: skip
    done = subprocess.run(plan_pd, capture_output=True, text=True, timeout=PLAN_TIMEOUT_SECONDS)
    assert done.returncode == 0, done.stderr
    assert len(PLANNED) >= 3, PLANNED
    for path in (emitted, disaggregated, *PLANNED):
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    pd_manifest = yaml.safe_load(disaggregated.read_text())
    body = wait_condition(cluster, namespace, "e2e-pd-plan", "Valid", "True", operator)
    assert condition(body, "Valid")["reason"] == "SpecValid"
    wanted_roles = pd_manifest["spec"]["disaggregation"]
    role_hpas = sorted(f"e2e-pd-plan-{role}" for role in wanted_roles)

    def roles_rendered() -> bool:
        found = children(cluster, namespace, "e2e-pd-plan")
        workloads = found.get(workload_kind(operator), [])
        return (
            found.get("HorizontalPodAutoscaler") == role_hpas
            and found.get(labels.ROLE_KIND) == role_hpas
            and {"e2e-pd-plan-p0", "e2e-pd-plan-d0"} <= set(workloads)
        )

    wait_until("e2e-pd-plan: an HPA and a TPUModelServerRole per role", roles_rendered, operator)
    for role, spec in wanted_roles.items():
        hpa = get(cluster, namespace, "horizontalpodautoscalers", f"e2e-pd-plan-{role}")["spec"]
        bounds = spec["autoscaling"]
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (
            bounds["minReplicas"], bounds["maxReplicas"],
        ), role  # fmt: skip
        assert hpa["scaleTargetRef"]["kind"] == labels.ROLE_KIND
    for path in (emitted, *PLANNED):
        manifest = yaml.safe_load(path.read_text())
        name = manifest["metadata"]["name"]
        body = wait_condition(cluster, namespace, name, "Valid", "True", operator)
        assert condition(body, "Valid")["reason"] == "SpecValid", path
        wanted = manifest["spec"]["autoscaling"]
        group = f"{name}-r0"

        def rendered(name: str = name, group: str = group) -> bool:
            found = children(cluster, namespace, name)
            return (
                found.get("HorizontalPodAutoscaler") == [name]
                and bool(found.get("Service"))
                and group in found.get(workload_kind(operator), [])
            )

        wait_until(f"{name}: its HorizontalPodAutoscaler, Service and {group}", rendered, operator)
        hpa = get(cluster, namespace, "horizontalpodautoscalers", name)["spec"]
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (
            wanted["minReplicas"],
            wanted["maxReplicas"],
        ), path
        (metric,) = hpa["metrics"]
        assert metric["pods"]["metric"]["name"] == TOKENS_IN_FLIGHT_METRIC
        shape = lookup(manifest["spec"]["tpu"]["generation"], manifest["spec"]["tpu"]["topology"])
        assert int(metric["pods"]["target"]["averageValue"]) == wanted["target"] * shape.chips
