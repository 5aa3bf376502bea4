"""KEDA for the local cluster (opt-in): its operator and its metrics apiserver, out of cluster.

Built by `scripts/build-keda.sh` (not by the default control-plane build, nor in CI). Both run
on 127.0.0.1 as KEDA's own Deployments would run them, with these differences:

- the operator reads the cluster through the admin kubeconfig and watches every namespace
  (``WATCH_NAMESPACE=""``); its own objects live in the ``keda`` namespace;
- no certificate rotation, webhook or APIService patching: the local CA issues one
  certificate (server and client use, for ``127.0.0.1``, ``localhost`` and the Service names)
  that the operator's gRPC metrics service and the metrics apiserver share for their mutual
  TLS (``ca.crt``, ``tls.crt``, ``tls.key`` in one directory, KEDA's layout);
- the metrics apiserver is registered as ``v1beta1.external.metrics.k8s.io`` through an
  ExternalName Service on loopback, as `tpuserve.cluster.metrics_adapter` registers Prometheus
  Adapter (which keeps the custom metrics API; KEDA takes the external one, which only HPAs
  made by KEDA read then).

KEDA's CRDs (ScaledObject, ScaledJob, TriggerAuthentication and the rest the operator watches)
come from KEDA's Go module, the version the binaries were built from.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tpuserve.cluster import kube
from tpuserve.cluster.metrics_adapter import API_VERSION

NAMESPACE = "keda"
SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
EXTERNAL_GROUP = "external.metrics.k8s.io"
OPERATOR_BINARY = "keda-operator"
ADAPTER_BINARY = "keda-adapter"
SERVING_NAMES = (
    "127.0.0.1",
    "localhost",
    f"{SERVICE}.{NAMESPACE}.svc",
    f"{OPERATOR_SERVICE}.{NAMESPACE}.svc",
)


def operator_env(kubeconfig: Path) -> dict[str, str]:
    return {
        "KUBECONFIG": str(kubeconfig),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
    }


def operator_argv(
    binary: Path, *, cert_dir: Path, grpc_port: int, metrics_port: int, health_port: int
) -> list[str]:
    return [
        str(binary),
        f"--cert-dir={cert_dir}",
        f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{health_port}",
        "--enable-cert-rotation=false",
        "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false",
        "--leader-elect=false",
        "--zap-log-level=info",
    ]


def adapter_argv(
    binary: Path,
    *,
    cert_dir: Path,
    kubeconfig: Path,
    secure_port: int,
    metrics_port: int,
    grpc_port: int,
) -> list[str]:
    return [
        str(binary),
        "--bind-address=127.0.0.1",
        f"--secure-port={secure_port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={cert_dir / 'tls.crt'}",
        f"--tls-private-key-file={cert_dir / 'tls.key'}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--metrics-service-address=127.0.0.1:{grpc_port}",
        f"--port={metrics_port}",
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


def api_service(port: int, ca_pem: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{API_VERSION}.{EXTERNAL_GROUP}"},
        "spec": {
            "group": EXTERNAL_GROUP,
            "version": API_VERSION,
            "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
            "caBundle": base64.b64encode(ca_pem).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }


def ensure_namespace(api: Any) -> None:
    core = kube.client().CoreV1Api(api)
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": NAMESPACE}})  # fmt: skip
    except kube.api_exception() as err:
        if getattr(err, "status", None) != 409:
            raise


def register(api: Any, port: int, ca_cert: Path) -> None:
    """Create (or replace) the Service and point the external metrics APIService at KEDA."""
    kube.register_api_services(api, service(port), [api_service(port, ca_cert.read_bytes())])


def available(api: Any) -> bool:
    """The external metrics APIService points at KEDA's Service and is Available."""
    registration = kube.client().ApiregistrationV1Api(api)
    found = registration.read_api_service(f"{API_VERSION}.{EXTERNAL_GROUP}")
    if found.spec.service is None or found.spec.service.name != SERVICE:
        return False
    conditions = {c.type: c.status for c in (found.status.conditions or [])}
    return conditions.get("Available") == "True"
