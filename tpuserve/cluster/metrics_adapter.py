"""Prometheus Adapter for the local cluster: the custom and external metrics APIs the HPA reads.

It runs out of cluster on 127.0.0.1 with the rules the chart ships
(`charts/tpuserve/files/prometheus-adapter-rules.yaml`, generated from the operator's HPA) and
reads the cluster's Prometheus. kube-apiserver reaches it through its APIServices
`v1beta1.custom.metrics.k8s.io` and `v1beta1.external.metrics.k8s.io`. An APIService names a
Service, and the aggregator dials a Service's ClusterIP (never loopback) but an ExternalName
Service's host name: so the Service is `ExternalName: localhost` on the adapter's port, and
the adapter's certificate (from the local CA) is for `NAME.NAMESPACE.svc`, the name the
aggregator checks. The aggregator presents the front-proxy client certificate; the adapter
trusts it through the `extension-apiserver-authentication` ConfigMap, as in a cluster.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tpuserve.cluster import kube

NAMESPACE = "kube-system"
SERVICE = "tpuserve-metrics-adapter"
API_GROUPS = ("custom.metrics.k8s.io", "external.metrics.k8s.io")
API_VERSION = "v1beta1"
RULES_FILE = (
    Path(__file__).resolve().parents[2] / "charts/tpuserve/files/prometheus-adapter-rules.yaml"
)
SERVING_NAMES = ("127.0.0.1", "localhost", f"{SERVICE}.{NAMESPACE}.svc")


def adapter_argv(
    binary: Path,
    *,
    port: int,
    cert: Path,
    key: Path,
    kubeconfig: Path,
    prometheus_url: str,
    config: Path = RULES_FILE,
) -> list[str]:
    return [
        str(binary),
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--cert-dir={cert.parent}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--prometheus-url={prometheus_url}",
        "--metrics-relist-interval=5s",
        f"--config={config}",
        "--v=2",
    ]


def service(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port}],
        },
    }


def api_services(port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{API_VERSION}.{group}"},
            "spec": {
                "group": group,
                "version": API_VERSION,
                "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
                "caBundle": base64.b64encode(ca_pem).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }
        for group in API_GROUPS
    ]


def register(api: Any, port: int, ca_cert: Path) -> None:
    """Create (or replace) the Service and the APIServices."""
    kube.register_api_services(api, service(port), api_services(port, ca_cert.read_bytes()))


def available(api: Any) -> bool:
    registration = kube.client().ApiregistrationV1Api(api)
    for group in API_GROUPS:
        found = registration.read_api_service(f"{API_VERSION}.{group}")
        conditions = {c.type: c.status for c in (found.status.conditions or [])}
        if conditions.get("Available") != "True":
            return False
    return True
