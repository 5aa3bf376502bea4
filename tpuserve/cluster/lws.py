"""Running the LeaderWorkerSet controller out of cluster, with its webhooks on loopback.

In a cluster, LWS serves its admission webhooks behind a Service and rotates its own
certificate for the Service's DNS name. This control plane has no Service network, so, as
controller-runtime's envtest does, the webhooks are registered with `clientConfig.url`
pointing at 127.0.0.1 and served with a certificate from the local CA; LWS's internal
certificate management and leader election are off. CRDs and webhook manifests are read from
LWS's module in the Go cache at run time.

The pod webhooks get the `objectSelector` that LWS's kustomize overlay adds
(`config/webhook/*-patch.yaml`), so only pods of a LeaderWorkerSet go through them.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from tpuserve.cluster import kube

# The label LWS puts on every pod of a group; the pod webhooks only see pods carrying it.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
POD_WEBHOOKS = ("mpod.kb.io", "vpod.kb.io")
CRD_GROUP = "leaderworkerset.x-k8s.io"


# LWS's CRD is 1.3 MB of YAML: libyaml parses it in ~0.3 s, pure-Python PyYAML in ~3 s.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def crd_paths(lws_module_dir: Path) -> list[Path]:
    """All CRD bases (LeaderWorkerSet and the DisaggregatedSet kinds its manager watches)."""
    return sorted((lws_module_dir / "config" / "crd" / "bases").glob("*.yaml"))


def lws_config(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """LWS's Configuration file (api/config/v1alpha1), loopback only, no metrics endpoint."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


def webhook_configurations(
    manifests_yaml: str, *, webhook_port: int, ca_bundle_pem: bytes, name_prefix: str = "lws-"
) -> list[dict[str, Any]]:
    """LWS's webhook configurations, rewritten to call https://127.0.0.1:PORT directly."""
    ca_bundle = base64.b64encode(ca_bundle_pem).decode()
    configurations = []
    for doc in yaml.load_all(manifests_yaml, Loader=_YAML_LOADER):
        if not doc:
            continue
        doc["metadata"]["name"] = name_prefix + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{webhook_port}{path}",
                "caBundle": ca_bundle,
            }
            if hook["name"] in POD_WEBHOOKS:
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]
                }
        configurations.append(doc)
    return configurations


def webhook_manifests_path(lws_module_dir: Path) -> Path:
    return lws_module_dir / "config" / "webhook" / "manifests.yaml"


def register_webhooks(api: Any, lws_module_dir: Path, webhook_port: int, ca_cert: Path) -> None:
    """Register LWS's webhooks at https://127.0.0.1:webhook_port (call once it serves)."""
    admission = kube.client().AdmissionregistrationV1Api(api)
    configurations = webhook_configurations(
        webhook_manifests_path(lws_module_dir).read_text(),
        webhook_port=webhook_port,
        ca_bundle_pem=ca_cert.read_bytes(),
    )
    for body in configurations:
        kube.create_or_replace_webhook(admission, body)
