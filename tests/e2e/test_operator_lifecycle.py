"""The operator over a server's life on a real control plane: too little TPU capacity, scale
subresource, rolling changes that never leave zero ready groups, children restored, garbage
collection, and an operator killed mid-reconcile or an apiserver restart.

Issue 6, items 4 to 7; both workload kinds (LeaderWorkerSet, StatefulSets), except the
apiserver restart, which the operator's watches survive whatever they make (one kind)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from tests.e2e.tms_harness import (
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
from tpuserve.cluster import Cluster, NodePool, kube
from tpuserve_operator import labels
from tpuserve_operator.render import RenderConfig

pytestmark = pytest.mark.e2e


def status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = tms(cluster, namespace, name).get("status") or {}
    return found


def wait_ready_replicas(
    cluster: Cluster, namespace: str, name: str, count: int, operator: OperatorProcess
) -> None:
    def done() -> bool:
        s = status(cluster, namespace, name)
        return (
            s.get("readyReplicas") == count
            and s.get("replicas") == count
            and s.get("updatedReplicas") == count
        )

    wait_until(f"{name}: {count} ready, updated replica groups", done, operator)


def test_too_little_tpu_capacity_degrades_until_a_pool_is_added(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # Two v6e 4x4 slices exist; a third replica has nowhere to go.
    apply(cluster, namespace, server("big", "v6e", "4x4", replicas=3))
    body = wait_condition(
        cluster, namespace, "big", "Degraded", "True", operator, reason="Unschedulable"
    )
    assert "google.com/tpu" in condition(body, "Degraded")["message"]
    # the two groups that found a slice serve meanwhile (Ready turns True with the first
    # of them, so wait for the second rather than read the count at that moment)
    wait_condition(cluster, namespace, "big", "Ready", "True", operator)
    wait_until(
        "big: 2 ready groups while the third is unschedulable",
        lambda: status(cluster, namespace, "big").get("readyReplicas") == 2,
        operator,
    )
    body = tms(cluster, namespace, "big")
    assert condition(body, "Degraded")["reason"] == "Unschedulable"
    pool = NodePool.tpu("v6e-4x4-extra", "v6e", "4x4")
    cluster.add_node_pool(pool)
    try:
        wait_ready_replicas(cluster, namespace, "big", 3, operator)
        body = wait_condition(cluster, namespace, "big", "Degraded", "False", operator)
        assert condition(body, "Progressing")["reason"] == "Complete"
    finally:
        cluster.kubectl("delete", "tms", "big", "-n", namespace, "--wait=true", "--timeout=60s")
        wait_until(
            "big's pods to be gone",
            lambda: not engine_pods(cluster, namespace, "big"),
            operator,
        )
        cluster.remove_node_pool(pool.name)


def test_scale_subresource_adds_and_removes_groups(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, server("s", "v6e", "2x4", replicas=1))
    wait_ready_replicas(cluster, namespace, "s", 1, operator)
    scale = cluster.kubectl("get", "tms", "s", "-n", namespace, "--subresource=scale", "-o", "json")
    assert '"replicas": 1' in scale.stdout
    cluster.kubectl("scale", "tms/s", "-n", namespace, "--replicas=3")
    wait_ready_replicas(cluster, namespace, "s", 3, operator)
    assert len(children(cluster, namespace, "s")[workload_kind(operator)]) == 3
    cluster.kubectl("scale", "tms/s", "-n", namespace, "--replicas=1")
    wait_ready_replicas(cluster, namespace, "s", 1, operator)
    wait_until(
        "scaled-down groups to be deleted",
        lambda: children(cluster, namespace, "s").get(workload_kind(operator)) == ["s-r0"],
        operator,
    )
    wait_until(
        "one group's pods left", lambda: len(engine_pods(cluster, namespace, "s")) == 1, operator
    )
    assert status(cluster, namespace, "s")["selector"].endswith("serving.tpuserve.dev/role=leader")


def hpa_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        cluster.kubectl("get", "hpa", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def test_autoscaling_creates_an_hpa_that_scales_through_the_scale_subresource(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # Kubernetes' HPA controller raises replicas to minReplicas before it reads any metric
    # (there is no metrics adapter here), through the server's scale subresource.
    autoscaling = {"minReplicas": 2, "maxReplicas": 3, "metric": "queue", "target": 4}
    apply(cluster, namespace, server("auto", "v6e", "2x4", replicas=1, autoscaling=autoscaling))
    wait_until(
        "auto's HorizontalPodAutoscaler",
        lambda: children(cluster, namespace, "auto").get("HorizontalPodAutoscaler") == ["auto"],
        operator,
    )
    hpa = hpa_of(cluster, namespace, "auto")
    assert hpa["spec"]["scaleTargetRef"]["kind"] == labels.KIND
    assert hpa["metadata"]["ownerReferences"][0]["name"] == "auto"
    wait_until(
        "the HPA to raise auto's spec.replicas to minReplicas",
        lambda: tms(cluster, namespace, "auto")["spec"]["replicas"] == 2,
        operator,
    )
    wait_ready_replicas(cluster, namespace, "auto", 2, operator)
    hpa = hpa_of(cluster, namespace, "auto")
    able = {c["type"]: c for c in hpa["status"].get("conditions", [])}["AbleToScale"]
    assert able["status"] == "True", able

    def metric_unavailable() -> bool:  # no adapter here: the HPA says so, and holds the bounds
        got = hpa_of(cluster, namespace, "auto")
        found = {c["type"]: c for c in got["status"].get("conditions", [])}
        return bool(found.get("ScalingActive", {}).get("status") == "False")

    wait_until("the HPA to report ScalingActive=False", metric_unavailable, operator)
    assert tms(cluster, namespace, "auto")["spec"]["replicas"] == 2

    # autoscaling removed: the HPA goes, the replicas it set stay
    remove = json.dumps([{"op": "remove", "path": "/spec/autoscaling"}])
    cluster.kubectl("patch", "tms", "auto", "-n", namespace, "--type=json", "-p", remove)
    wait_until(
        "auto's HPA to be pruned",
        lambda: "HorizontalPodAutoscaler" not in children(cluster, namespace, "auto"),
        operator,
    )
    assert tms(cluster, namespace, "auto")["spec"]["replicas"] == 2


@pytest.mark.parametrize("operator", ["statefulset"], indirect=True)  # one kind: the count
def test_a_roles_autoscaler_scales_that_role_alone(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    decode = {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}
    pd = server(
        "pd", "v6e", "2x4", engine="simulated",
        disaggregation={"prefill": {"replicas": 1}, "decode": decode},
    )  # fmt: skip
    apply(cluster, namespace, pd)
    wait_ready_replicas(cluster, namespace, "pd", 2, operator)
    hpa = hpa_of(cluster, namespace, "pd-decode")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": labels.API_VERSION,
        "kind": labels.ROLE_KIND,
        "name": "pd-decode",
    }
    # the role's own, no server-wide one
    assert children(cluster, namespace, "pd")["HorizontalPodAutoscaler"] == ["pd-decode"]
    prefill = get(cluster, namespace, "statefulset", "pd-p0")
    prefill_pod = get(cluster, namespace, "pod", "pd-p0-0")

    cluster.kubectl("scale", f"{labels.ROLE_PLURAL}/pd-decode", "-n", namespace, "--replicas=3")
    wait_ready_replicas(cluster, namespace, "pd", 4, operator)
    roles = {r["role"]: r for r in status(cluster, namespace, "pd")["roles"]}
    assert (roles["decode"]["desired"], roles["decode"]["groups"]) == (3, [0, 1, 2])
    assert (roles["prefill"]["desired"], roles["prefill"]["groups"]) == (1, [0])
    # the prefill group and its pod are the ones from before (not rolled, not recreated)
    after = get(cluster, namespace, "statefulset", "pd-p0")
    assert after["metadata"]["uid"] == prefill["metadata"]["uid"]
    assert after["metadata"]["generation"] == prefill["metadata"]["generation"]
    assert (
        get(cluster, namespace, "pod", "pd-p0-0")["metadata"]["uid"]
        == (prefill_pod["metadata"]["uid"])
    )

    def scale_reports_three() -> bool:
        scale = json.loads(
            cluster.kubectl(
                "get", labels.ROLE_PLURAL, "pd-decode", "-n", namespace,
                "--subresource=scale", "-o", "json",
            ).stdout
        )  # fmt: skip
        return bool(
            scale["spec"]["replicas"] == 3
            and scale["status"].get("replicas") == 3
            and "serving.tpuserve.dev/pd-role=decode" in scale["status"].get("selector", "")
        )

    wait_until(
        "pd-decode's scale subresource to report 3 decode groups", scale_reports_three, operator
    )


def _ready_groups(pods: dict[str, dict[str, Any]], hosts: int) -> dict[str, set[str]]:
    """Group -> revisions of its pods, for groups whose every host is ready."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for pod in pods.values():
        by_group.setdefault(pod["group"], []).append(pod)
    return {
        group: {p["revision"] for p in members}
        for group, members in by_group.items()
        if len(members) == hosts and all(p["ready"] for p in members)
    }


def test_a_spec_change_rolls_groups_and_never_leaves_zero_ready(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    hosts = 4
    apply(cluster, namespace, server("roll", "v6e", "4x4", replicas=2))
    wait_ready_replicas(cluster, namespace, "roll", 2, operator)
    old_revision = status(cluster, namespace, "roll")["revision"]
    api_client = cluster.api_client()
    core = kube.client().CoreV1Api(api_client)
    selector = f"{labels.INSTANCE}=roll,{labels.COMPONENT}={labels.COMPONENT_MODEL_SERVER}"
    listing = core.list_namespaced_pod(namespace, label_selector=selector)
    pods: dict[str, dict[str, Any]] = {}

    def remember(pod: Any) -> None:
        meta = pod.metadata
        ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
        pods[meta.name] = {
            "group": meta.labels[labels.SLICE_GROUP],
            "revision": meta.labels[labels.REVISION],
            "ready": ready and meta.deletion_timestamp is None,
        }

    for pod in listing.items:
        remember(pod)
    assert len(_ready_groups(pods, hosts)) == 2
    patch = {"spec": {"engine": {"kvCacheDtype": "fp8"}}}
    kube.client().CustomObjectsApi(api_client).patch_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, labels.PLURAL, "roll", patch
    )
    lowest = 2
    finished = threading.Event()
    stream = kube.watch().Watch()
    try:
        for event in stream.stream(
            core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            resource_version=listing.metadata.resource_version,
            timeout_seconds=120,
        ):
            pod = event["object"]
            if event["type"] == "DELETED":
                pods.pop(pod.metadata.name, None)
            else:
                remember(pod)
            ready = _ready_groups(pods, hosts)
            lowest = min(lowest, len(ready))
            assert ready, f"no ready replica group after {event['type']} {pod.metadata.name}"
            if len(ready) == 2 and all(old_revision not in revs for revs in ready.values()):
                finished.set()
                break
    finally:
        stream.stop()
        api_client.close()
    assert finished.is_set(), f"rollout did not finish; pods: {pods}\n{operator.log_tail()}"
    assert lowest == 1  # groups really went down one at a time
    wait_condition(cluster, namespace, "roll", "Progressing", "False", operator, reason="Complete")
    assert status(cluster, namespace, "roll")["revision"] != old_revision


@pytest.mark.parametrize("deletion", ["graceful", "forced"])
def test_a_pod_that_restarts_takes_its_whole_multi_host_group_with_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess, deletion: str
) -> None:
    # A slice runs one program: deleting one worker pod must replace every pod of its group.
    # LWS does it itself if it sees the worker terminating; for one gone at once (a forced
    # deletion, a pod lost with its node) it may not, and the operator does it on both paths
    # (unit-tested in test_reconciler: which of the two acts first here is a race).
    apply(cluster, namespace, server("grp", "tpu7x", "2x2x2", replicas=1))
    wait_ready_replicas(cluster, namespace, "grp", 1, operator)
    pods = engine_pods(cluster, namespace, "grp")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    assert len(before) == 2
    (worker,) = [
        p["metadata"]["name"]
        for p in pods
        if p["metadata"]["labels"][labels.ROLE] != labels.ROLE_LEADER
    ]
    forced = ("--force", "--grace-period=0") if deletion == "forced" else ()
    cluster.kubectl("delete", "pod", worker, "-n", namespace, "--wait=false", *forced)

    def all_replaced() -> bool:
        now = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in engine_pods(cluster, namespace, "grp")
            if not p["metadata"].get("deletionTimestamp")
        }
        return len(now) == 2 and all(uid != before.get(name) for name, uid in now.items())

    wait_until("every pod of grp's group to be replaced", all_replaced, operator)
    wait_ready_replicas(cluster, namespace, "grp", 1, operator)
    if workload_kind(operator) == "StatefulSet":  # with LWS, either may restart it first
        events = get(cluster, namespace, "events")["items"]
        assert any(e.get("reason") == "GroupRestarted" for e in events), operator.log_tail()


def test_children_deleted_by_hand_come_back_and_deletion_collects_everything(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, server("own", "tpu7x", "2x2x2", replicas=1))
    wait_ready_replicas(cluster, namespace, "own", 1, operator)
    before = children(cluster, namespace, "own")
    kind = workload_kind(operator)
    victims = [
        ("deployment", "own-router"),
        ("service", "own-leaders"),
        ("service", "own-router-peers"),
        ("networkpolicy", "own-router"),
        ("poddisruptionbudget", "own"),
        ("configmap", "own-router"),
        (kind.lower(), "own-r0"),
    ]
    for resource, name in victims:
        cluster.kubectl("delete", resource, name, "-n", namespace, "--wait=false")
    cluster.kubectl("scale", "deployment/own-router", "-n", namespace, "--replicas=5", check=False)
    wait_until(
        "every child to be back", lambda: children(cluster, namespace, "own") == before, operator
    )
    wait_ready_replicas(cluster, namespace, "own", 1, operator)
    deployment = cluster.kubectl(
        "get", "deployment", "own-router", "-n", namespace, "-o", "jsonpath={.spec.replicas}"
    )
    assert deployment.stdout == str(RenderConfig().router_replicas)  # not the 5 scaled to

    cluster.kubectl("delete", "tms", "own", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_until(
        "garbage collection of every child",
        lambda: children(cluster, namespace, "own") == {},
        operator,
    )
    wait_until("the pods to be gone", lambda: not engine_pods(cluster, namespace, "own"), operator)


def test_an_operator_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, server("crash", "v6e", "2x4", replicas=3))
    wait_until("the first children", lambda: bool(children(cluster, namespace, "crash")), operator)
    operator.kill()
    operator.restarts += 1
    operator.start()
    wait_ready_replicas(cluster, namespace, "crash", 3, operator)
    found = children(cluster, namespace, "crash")
    assert found[workload_kind(operator)] == ["crash-r0", "crash-r1", "crash-r2"]
    assert found["Deployment"] == ["crash-router"]
    assert found["PodDisruptionBudget"] == ["crash", "crash-router"]  # engines, router
    assert found["NetworkPolicy"] == ["crash-engines", "crash-router"]
    assert "crash-router-peers" in found["Service"]
    assert len(engine_pods(cluster, namespace, "crash")) == 3


@pytest.mark.parametrize("operator", ["statefulset"], indirect=True)
def test_an_apiserver_restart_is_survived(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, server("steady", "v6e", "2x4", replicas=2))
    wait_ready_replicas(cluster, namespace, "steady", 2, operator)
    cluster.restart_apiserver()
    cluster.kubectl("scale", "tms/steady", "-n", namespace, "--replicas=1")
    wait_ready_replicas(cluster, namespace, "steady", 1, operator)
    wait_until(
        "the second group to be deleted",
        lambda: (
            children(cluster, namespace, "steady").get(workload_kind(operator)) == ["steady-r0"]
        ),
        operator,
    )
    assert operator.process is not None
    assert operator.process.alive()
    metrics = operator.metrics()
    assert 'tpuserve_replica_info{model_name="qwen3-8b",namespace="' + namespace in metrics
