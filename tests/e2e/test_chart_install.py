"""The chart installs into a real kube-apiserver and `helm uninstall` leaves nothing behind but
the CRDs (Helm never deletes CRDs; docs/observability.md and the chart README say so).

The cluster serves no monitoring.coreos.com API, so the chart renders no monitors and NOTES.txt
says so (the monitors themselves are validated against their schemas in tests/chart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuserve.cluster import Cluster

pytestmark = pytest.mark.e2e

CHART = Path(__file__).resolve().parents[2] / "charts" / "tpuserve"
RELEASE = "tpuserve"
CRDS = {
    "tpumodelservers.serving.tpuserve.dev",
    "tpumodelserverroles.serving.tpuserve.dev",
    "tpugateways.serving.tpuserve.dev",
    "clusterkopfpeerings.kopf.dev",
    "kopfpeerings.kopf.dev",
}
NAMESPACED = (
    "configmaps,services,serviceaccounts,deployments,poddisruptionbudgets,roles,rolebindings"
)
CLUSTER_SCOPED = (
    "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings"
)


def owned(cluster: Cluster, kinds: str, *namespaces: str) -> list[str]:
    """`Kind/name` of every object Helm labelled as this release's."""
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/managed-by=Helm"
    found = []
    for namespace in namespaces or ("",):
        scope = ["-n", namespace] if namespace else []
        listing = yaml.safe_load(
            cluster.kubectl("get", kinds, *scope, "-l", selector, "-o", "yaml").stdout
        )
        found += [f"{i['kind']}/{i['metadata']['name']}" for i in listing.get("items") or []]
    return sorted(found)


def crds(cluster: Cluster) -> set[str]:
    listing: dict[str, Any] = yaml.safe_load(cluster.kubectl("get", "crds", "-o", "yaml").stdout)
    return {i["metadata"]["name"] for i in listing["items"]}


@pytest.mark.parametrize("mode", ["cluster-wide", "namespace-scoped"])
def test_helm_install_then_uninstall_leaves_only_the_crds(
    cluster: Cluster, namespace: str, mode: str
) -> None:
    watched = [f"{namespace}-a", f"{namespace}-b"]
    sets = []
    if mode == "namespace-scoped":
        for ns in watched:
            cluster.kubectl("create", "namespace", ns)
        sets = ["--set", f"operator.watchNamespaces={{{','.join(watched)}}}"]
    try:
        done = cluster.helm(
            "install", RELEASE, str(CHART), "--namespace", namespace, *sets,
            "--wait", "--timeout", "180s",
        )  # fmt: skip
        assert "NO monitors or rules were created" in done.stdout  # no prometheus-operator API
        assert crds(cluster) >= CRDS
        objects = owned(cluster, NAMESPACED, namespace)
        assert f"Deployment/{RELEASE}-operator" in objects
        assert f"Service/{RELEASE}-operator" in objects
        assert f"ServiceAccount/{RELEASE}" in objects
        dashboards = [o for o in objects if o.startswith("ConfigMap/") and "dashboard" in o]
        assert len(dashboards) == len(list((CHART / "dashboards").glob("*.json")))
        cluster_objects = owned(cluster, CLUSTER_SCOPED)
        assert f"ClusterRole/{RELEASE}-operator" in cluster_objects
        if mode == "namespace-scoped":
            for ns in watched:
                assert owned(cluster, "roles,rolebindings", ns), ns
        deployment = yaml.safe_load(
            cluster.kubectl(
                "get", "deployment", f"{RELEASE}-operator", "-n", namespace, "-o", "yaml"
            ).stdout
        )
        assert deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"]

        cluster.helm("uninstall", RELEASE, "--namespace", namespace, "--wait")
        assert owned(cluster, NAMESPACED, namespace, *watched) == []
        assert owned(cluster, CLUSTER_SCOPED) == []
        assert crds(cluster) >= CRDS  # kept: deleting them would delete every TPUModelServer
    finally:
        cluster.helm("uninstall", RELEASE, "--namespace", namespace, check=False)
        if mode == "namespace-scoped":
            for ns in watched:
                cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
