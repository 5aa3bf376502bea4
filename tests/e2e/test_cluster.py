"""The local control plane is a real Kubernetes: its scheduler places TPU pods on the fake GKE
pools by selectors, taints and `google.com/tpu` capacity, and kwok runs them to Ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tpu import topology
from tests.e2e.tms_harness import NOT_YET, POLL_SECONDS
from tests.waiting import eventually
from tpuserve.cluster import Cluster, NodePool, kube, load_profile
from tpuserve.cluster.node_pools import FAKE_NODE_LABEL
from tpuserve.cluster.process import ManagedProcess

pytestmark = pytest.mark.e2e

POD_TIMEOUT_SECONDS = 90.0
TPU_TOLERATION = {
    "key": topology.TPU_TAINT_KEY,
    "operator": "Equal",
    "value": topology.TPU_TAINT_VALUE,
    "effect": topology.TPU_TAINT_EFFECT,
}


def tpu_pod_spec(
    generation: str, topology_name: str, *, tolerate: bool = True, pool: str | None = None
) -> dict[str, Any]:
    """A pod spec asking for one host of a slice, as the operator renders it."""
    shape = topology.lookup(generation, topology_name)
    selector = shape.node_selector()
    if pool is not None:
        selector[topology.NODE_POOL_LABEL] = pool
    chips = str(shape.chips_per_host)
    return {
        "nodeSelector": selector,
        "tolerations": [TPU_TOLERATION] if tolerate else [],
        "containers": [
            {
                "name": "engine",
                "image": "tpuserve/engine:test",
                "resources": {
                    "requests": {topology.TPU_RESOURCE: chips},
                    "limits": {topology.TPU_RESOURCE: chips},
                },
            }
        ],
    }


def pod_body(
    name: str, spec: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def pod_ready(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def pod_condition(pod: Any, kind: str) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def wait_pods(
    core_v1: Any,
    namespace: str,
    selector: str,
    count: int,
    check: Callable[[Any], bool] = pod_ready,
    what: str = "Running and Ready",
) -> list[Any]:
    def done() -> list[Any] | None:
        pods: list[Any] = core_v1.list_namespaced_pod(namespace, label_selector=selector).items
        return pods if len(pods) == count and all(check(p) for p in pods) else None

    return eventually(
        done,
        what=f"{count} pods {selector} {what}",
        timeout_seconds=POD_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )


def node_pool_of(core_v1: Any, node_name: str) -> str:
    labels: dict[str, str] = core_v1.read_node(node_name).metadata.labels
    return labels[topology.NODE_POOL_LABEL]


def unschedulable(pod: Any) -> bool:
    condition = pod_condition(pod, "PodScheduled")
    return bool(
        pod.status.phase == "Pending"
        and condition is not None
        and condition.status == "False"
        and condition.reason == "Unschedulable"
    )


# ---- the control plane itself --------------------------------------------------------------


def test_cluster_reports_its_real_version(cluster: Cluster) -> None:
    version = cluster.server_version()
    assert version["gitVersion"] == cluster.toolchain.k8s_version
    major, minor, _ = cluster.toolchain.k8s_version.lstrip("v").split(".")
    assert (version["major"], version["minor"]) == (major, minor)
    seen_by_kubectl = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert seen_by_kubectl["serverVersion"]["gitVersion"] == cluster.toolchain.k8s_version


def test_every_profile_node_is_ready_with_gke_labels_taints_and_allocatable(
    cluster: Cluster, core_v1: Any
) -> None:
    nodes = {
        n.metadata.name: n
        for n in core_v1.list_node(label_selector=f"{FAKE_NODE_LABEL}=true").items
    }
    for pool in load_profile():
        for expected in pool.node_manifests():
            node = nodes[expected["metadata"]["name"]]
            assert pod_condition(node, "Ready").status == "True"
            for key, value in expected["metadata"]["labels"].items():
                assert node.metadata.labels.get(key) == value, (node.metadata.name, key)
            taints = [(t.key, t.value, t.effect) for t in node.spec.taints or []]
            if pool.shape is not None:
                assert taints == [
                    (topology.TPU_TAINT_KEY, topology.TPU_TAINT_VALUE, topology.TPU_TAINT_EFFECT)
                ]
                assert node.status.allocatable[topology.TPU_RESOURCE] == str(
                    pool.shape.chips_per_host
                )
            else:
                assert taints == []
                assert topology.TPU_RESOURCE not in node.status.allocatable


def test_restart_apiserver_keeps_state_and_serves_again(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    before = cluster.processes["kube-apiserver"].pid
    core_v1.create_namespaced_config_map(namespace, {"metadata": {"name": "survivor"}})
    cluster.restart_apiserver()
    assert cluster.processes["kube-apiserver"].pid != before
    assert core_v1.read_namespaced_config_map("survivor", namespace).metadata.name == "survivor"
    core_v1.create_namespaced_pod(namespace, pod_body("after-restart", tpu_pod_spec("v6e", "2x4")))
    wait_pods(core_v1, namespace, "", 1)


def test_helm_installs_a_chart_that_requires_this_kubernetes_version(
    cluster: Cluster, core_v1: Any, namespace: str, tmp_path: Path
) -> None:
    """helm reads the server version from /version; the build's ldflags make it real."""
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    major_minor = ".".join(cluster.toolchain.k8s_version.lstrip("v").split(".")[:2])
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "probe",
                "version": "0.1.0",
                "kubeVersion": f">={major_minor}.0-0",
            }
        )
    )
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
    )
    cluster.helm("install", "probe", str(chart), "--namespace", namespace, "--wait")
    data = core_v1.read_namespaced_config_map("probe", namespace).data
    assert data == {"kube": cluster.toolchain.k8s_version}
    cluster.helm("uninstall", "probe", "--namespace", namespace, "--wait")


def test_service_account_kubeconfig_is_bound_by_rbac(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    core_v1.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    kubeconfig = cluster.service_account_kubeconfig(namespace, "reader")
    as_reader = ["--kubeconfig", str(kubeconfig), "--namespace", namespace]
    denied = cluster.kubectl(*as_reader, "get", "pods", check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    api = cluster.api_client()
    try:
        rbac = kube.client().RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )
    finally:
        api.close()
    eventually(
        lambda: cluster.kubectl(*as_reader, "get", "pods", check=False).returncode == 0,
        what="the reader to be allowed to list pods",
        timeout_seconds=POD_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )
    assert cluster.kubectl(*as_reader, "get", "nodes", check=False).returncode != 0


# ---- scheduling onto fake TPU pools --------------------------------------------------------


def test_tpu_pod_with_selectors_and_toleration_runs_on_the_matching_pool(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    core_v1.create_namespaced_pod(
        namespace, pod_body("engine-0", tpu_pod_spec("v6e", "4x4"), {"app": "one"})
    )
    (pod,) = wait_pods(core_v1, namespace, "app=one", 1)
    node = core_v1.read_node(pod.spec.node_name)
    assert node.metadata.labels[topology.ACCELERATOR_LABEL] == "tpu-v6e-slice"
    assert node.metadata.labels[topology.TOPOLOGY_LABEL] == "4x4"
    assert node_pool_of(core_v1, pod.spec.node_name) in {"v6e-4x4-a", "v6e-4x4-b"}
    assert pod.status.pod_ip  # kwok's fake IP: it exists in the API, and is never dialled


def test_ready_pods_are_listed_ready_in_their_services_endpointslice(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    """kwok marks pods Ready, so EndpointSlices list them, as router discovery expects."""
    core_v1.create_namespaced_pod(
        namespace, pod_body("leader-0", tpu_pod_spec("v6e", "2x4"), {"app": "leader"})
    )
    core_v1.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "leaders"},
            "spec": {"selector": {"app": "leader"}, "ports": [{"name": "http", "port": 30000}]},
        },
    )
    (pod,) = wait_pods(core_v1, namespace, "app=leader", 1)
    api = cluster.api_client()
    try:
        discovery = kube.client().DiscoveryV1Api(api)

        def listed() -> list[Any]:
            slices = discovery.list_namespaced_endpoint_slice(
                namespace, label_selector="kubernetes.io/service-name=leaders"
            ).items
            return [e for s in slices for e in s.endpoints or []]

        endpoints = eventually(
            listed,
            what="the leaders EndpointSlice",
            timeout_seconds=POD_TIMEOUT_SECONDS,
            interval_seconds=POLL_SECONDS,
            ignore=NOT_YET,
        )
    finally:
        api.close()
    (endpoint,) = endpoints
    assert endpoint.addresses == [pod.status.pod_ip]  # a fake kwok IP: read, never dialled
    assert endpoint.conditions.ready is True
    assert endpoint.target_ref.name == "leader-0"


def test_tpu_pod_without_the_toleration_stays_pending_unschedulable(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    spec = tpu_pod_spec("v6e", "4x4", tolerate=False)
    core_v1.create_namespaced_pod(namespace, pod_body("intolerant", spec, {"app": "intolerant"}))
    (pod,) = wait_pods(core_v1, namespace, "app=intolerant", 1, unschedulable, "Unschedulable")
    assert pod.spec.node_name is None
    assert "untolerated taint" in pod_condition(pod, "PodScheduled").message


def test_statefulset_of_four_hosts_fills_one_pools_four_nodes(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    api = cluster.api_client()
    try:
        kube.client().AppsV1Api(api).create_namespaced_stateful_set(
            namespace,
            {
                "metadata": {"name": "slice"},
                "spec": {
                    "replicas": 4,
                    "serviceName": "slice",
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": "slice"}},
                    "template": {
                        "metadata": {"labels": {"app": "slice"}},
                        "spec": tpu_pod_spec("v6e", "4x4", pool="v6e-4x4-b"),
                    },
                },
            },
        )
    finally:
        api.close()
    pods = wait_pods(core_v1, namespace, "app=slice", 4)
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 4, "4 pods x 4 chips on 4-chip nodes: one pod per host"
    assert nodes == set(NodePool.tpu("v6e-4x4-b", "v6e", "4x4").node_names())


def test_exhausted_capacity_leaves_pods_pending_until_a_pool_is_added(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    # The profile has one tpu7x 2x2x2 slice: 2 hosts x 4 chips. Ask for two slices' worth.
    for i in range(4):
        core_v1.create_namespaced_pod(
            namespace, pod_body(f"host-{i}", tpu_pod_spec("tpu7x", "2x2x2"), {"app": "ironwood"})
        )

    def two_running_two_short_of_tpu(pod: Any) -> bool:
        if pod_ready(pod):
            return True
        condition = pod_condition(pod, "PodScheduled")
        return unschedulable(pod) and f"Insufficient {topology.TPU_RESOURCE}" in condition.message

    pods = wait_pods(core_v1, namespace, "app=ironwood", 4, two_running_two_short_of_tpu, "placed")
    assert sum(pod_ready(p) for p in pods) == 2

    extra = NodePool.tpu("tpu7x-2x2x2-extra", "tpu7x", "2x2x2")
    cluster.add_node_pool(extra)
    try:
        pods = wait_pods(core_v1, namespace, "app=ironwood", 4)
        pools = sorted(node_pool_of(core_v1, p.spec.node_name) for p in pods)
        assert pools == ["tpu7x-2x2x2"] * 2 + ["tpu7x-2x2x2-extra"] * 2
    finally:
        core_v1.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        eventually(
            lambda: not core_v1.list_namespaced_pod(namespace).items,
            what="ironwood pods deleted",
            timeout_seconds=POD_TIMEOUT_SECONDS,
            interval_seconds=POLL_SECONDS,
            ignore=NOT_YET,
        )
        cluster.remove_node_pool(extra.name)
    assert not core_v1.list_node(label_selector=f"{topology.NODE_POOL_LABEL}={extra.name}").items


def test_leaderworkerset_group_gets_its_worker_pods(
    cluster: Cluster, core_v1: Any, namespace: str
) -> None:
    if not cluster.lws_enabled:
        reason = (
            "the LWS controller was not built (scripts/build-control-plane.sh reports why); "
            "the StatefulSet path covers multi-host groups"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason} (CI=true: e2e tests never skip)")
        pytest.skip(reason)
    spec = tpu_pod_spec("v6e", "4x4", pool="v6e-4x4-a")
    api = cluster.api_client()
    try:
        kube.client().CustomObjectsApi(api).create_namespaced_custom_object(
            "leaderworkerset.x-k8s.io",
            "v1",
            namespace,
            "leaderworkersets",
            {
                "apiVersion": "leaderworkerset.x-k8s.io/v1",
                "kind": "LeaderWorkerSet",
                "metadata": {"name": "group"},
                "spec": {
                    "replicas": 1,
                    "leaderWorkerTemplate": {
                        "size": 4,
                        "leaderTemplate": {"spec": spec},
                        "workerTemplate": {"spec": spec},
                    },
                },
            },
        )
    finally:
        api.close()
    pods = wait_pods(core_v1, namespace, "leaderworkerset.sigs.k8s.io/name=group", 4)
    worker_indexes = sorted(
        p.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"] for p in pods
    )
    assert worker_indexes == ["0", "1", "2", "3"]  # labels set by LWS's pod webhook
    assert {node_pool_of(core_v1, p.spec.node_name) for p in pods} == {"v6e-4x4-a"}
    assert len({p.spec.node_name for p in pods}) == 4


# ---- `tpuserve cluster up|down` --------------------------------------------------------------


def test_cluster_up_and_down_leave_no_process_behind(cluster: Cluster, tmp_path: Path) -> None:
    """A second, tiny control plane through the CLI: up detaches, down stops every process."""
    profile = tmp_path / "tiny.yaml"
    profile.write_text(
        yaml.safe_dump(
            {"pools": [{"name": "v6e-single", "tpu": {"generation": "v6e", "topology": "2x2"}}]}
        )
    )
    run_dir = tmp_path / "run"
    cli = [sys.executable, "-m", "tpuserve", "cluster"]
    up = subprocess.run(
        [*cli, "up", "--run-dir", str(run_dir), "--profile", str(profile), "--no-lws"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    assert f"export KUBECONFIG={run_dir / 'kubeconfig'}" in up.stdout
    state = json.loads((run_dir / "state.json").read_text())
    processes = [ManagedProcess.from_state(p) for p in state["processes"]]
    try:
        # `up` runs pods by default: the pod runner, Prometheus and (when built) its adapter too.
        adapter = {"metrics-adapter"} if cluster.toolchain.has_metrics_adapter else set()
        assert {p.name for p in processes} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "pod-runner",
            "monitoring",
            *adapter,
        }
        assert all(p.alive() for p in processes)
        nodes = subprocess.run(
            [
                str(cluster.toolchain.tool("kubectl")),
                f"--kubeconfig={run_dir / 'kubeconfig'}",
                "get",
                "nodes",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
        assert nodes == ["node/gke-tpuserve-v6e-single-0"]
        again = subprocess.run(
            [*cli, "up", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert again.returncode == 1
        assert "already running" in again.stderr
    finally:
        down = subprocess.run(
            [*cli, "down", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert not [p.name for p in processes if p.alive()]
    assert not run_dir.exists()
