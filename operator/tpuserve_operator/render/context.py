"""What every render function gets: the validated server, the operator's settings, and names."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sglang_tpu.contract.group_contract import GroupContract
from sglang_tpu.version import tpuserve_version
from tpuserve_operator import disaggregation, labels
from tpuserve_operator.validation import ValidSpec

DEFAULT_IMAGE = f"ghcr.io/tpuserve/tpuserve:{tpuserve_version()}"
DEFAULT_ENGINE_IMAGE = f"ghcr.io/tpuserve/tpuserve-tpu:{tpuserve_version()}"
DEFAULT_SGLANG_JAX_IMAGE = f"ghcr.io/tpuserve/tpuserve-sglang-jax:{tpuserve_version()}"
"""The image of sglang_tpu/Dockerfile.sglang-jax (SGLang-JAX from its pinned source commit)."""
# prometheus-operator names the Service of every Prometheus it runs `prometheus-operated`.
DEFAULT_KEDA_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"

ROUTER_PORT = 8000
ROUTER_METRICS_PORT = 9000
ROUTER_PEER_PORT = 5570
"""Where each router replica publishes its routing decisions to the other replicas of its
server (`tpuserve router --peer-port`; the container port and Service port named `peers`)."""
ROUTER_PEER_PORT_NAME = "peers"
ROUTER_PEER_SNAPSHOT_PORT = ROUTER_PEER_PORT + 1
"""Where each router replica answers a starting replica's request for its KV-cache index:
the router binds the port after ``--peer-port`` (docs/router.md, Several router replicas);
the container port and Service port named `ROUTER_PEER_SNAPSHOT_PORT_NAME`."""
ROUTER_PEER_SNAPSHOT_PORT_NAME = "peer-snapshot"
ROUTER_ADMIN_PORT = 8002
"""Where each router serves its admin API to its own pod only (`tpuserve router --admin-port`,
bound to 127.0.0.1; no container port: `kubectl port-forward` reaches it)."""
# Non-root user of the tpuserve images (the chart runs the operator as the same user).
RUN_AS_USER = 65532

Manifest = dict[str, Any]
WorkloadKind = Literal["LeaderWorkerSet", "StatefulSet"]


DEFAULT_ROUTER_RESOURCES: Mapping[str, Any] = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "2Gi"},
}
"""The router container's resources unless a server or the operator's --router-resources
says otherwise (the chart's router.resources default is the same; a test keeps it so)."""


METRICS_NAMESPACE = "monitoring"
"""Where the default Prometheus peer runs (kube-prometheus-stack's usual namespace): a pod
labelled prometheus elsewhere is anyone's to make, so none is admitted from any namespace."""
DEFAULT_METRICS_FROM: tuple[Mapping[str, Any], ...] = (
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": METRICS_NAMESPACE}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    },
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}}},
)
"""Who scrapes engines (NetworkPolicy peers) unless the operator's --metrics-from says
otherwise: Prometheus pods in `METRICS_NAMESPACE`, and GKE Managed Prometheus's collectors."""


@dataclass(frozen=True, slots=True)
class RenderConfig:
    """Operator settings and cluster capabilities that shape the children."""

    engine_image: str = DEFAULT_ENGINE_IMAGE
    sglang_jax_engine_image: str = DEFAULT_SGLANG_JAX_IMAGE
    router_image: str = DEFAULT_IMAGE
    router_policy: str | None = None  # None: the router's own default policy
    # Several replicas: a node's loss or a rollout never takes the endpoint away; they share
    # their routing decisions (render/router.py, peering), so N route as well as one.
    router_replicas: int = 2
    router_resources: Mapping[str, Any] = field(
        default_factory=lambda: copy.deepcopy(DEFAULT_ROUTER_RESOURCES)
    )
    # The routers' --worker-networks (the cluster's pod network); empty: the router's default.
    router_worker_networks: tuple[str, ...] = ()
    network_policy: Literal["engines", "none"] = "engines"  # render/network_policy.py
    metrics_from: tuple[Mapping[str, Any], ...] = DEFAULT_METRICS_FROM  # NetworkPolicy peers
    # The namespace of the operator's pods, admitted to engines' HTTP port to read cold
    # starts (render/network_policy.py); None: not admitted (a local run, or no reports).
    operator_namespace: str | None = None
    # Cluster capabilities, discovered by the operator (flags of `tpuserve render`).
    leaderworkerset: bool = False
    prometheus_operator: bool = False
    inference_pool: bool = False  # the InferencePool CRD (render/inference_pool.py)
    role_scales: bool = True  # the TPUModelServerRole CRD (per-role autoscaling, render/roles.py)
    keda: bool = False  # KEDA's ScaledObject CRD (autoscaling.engine keda, render/autoscaler.py)
    # The Prometheus KEDA's triggers query (the one that scrapes the engines and runs the
    # chart's recording rules).
    keda_prometheus_url: str = DEFAULT_KEDA_PROMETHEUS_URL


@dataclass(frozen=True, slots=True)
class Server:
    """One TPUModelServer to render: identity, validated spec, operator settings."""

    name: str
    namespace: str
    valid: ValidSpec
    config: RenderConfig
    uid: str | None = None  # None under `tpuserve render` (no cluster, no owner reference)
    restarted_at: str | None = None  # the restart annotation's value
    # The role whose groups this is the view of (render/roles.py), None: a plain server's.
    pd_role: str | None = None

    @property
    def workload_kind(self) -> WorkloadKind:
        return "LeaderWorkerSet" if self.config.leaderworkerset else "StatefulSet"

    def owner_references(self) -> list[Manifest]:
        if self.uid is None:
            return []
        return [
            {
                "apiVersion": labels.API_VERSION,
                "kind": labels.KIND,
                "name": self.name,
                "uid": self.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]

    def metadata(
        self,
        name: str,
        component: str,
        extra_labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Manifest:
        meta: Manifest = {
            "name": name,
            "namespace": self.namespace,
            "labels": {**labels.common(self.name, component), **(extra_labels or {})},
        }
        if annotations:
            meta["annotations"] = dict(annotations)
        owners = self.owner_references()
        if owners:
            meta["ownerReferences"] = owners
        return meta

    # -- names --------------------------------------------------------------------------------

    def group_name(self, replica: int) -> str:
        """The replica group's workload (and, for StatefulSets, its headless Service)."""
        return group_name(self.name, self.pd_role, replica)

    def worker_statefulset_name(self, replica: int) -> str:
        return f"{self.group_name(replica)}-w"

    @property
    def endpoint_service_name(self) -> str:
        return self.name

    @property
    def leaders_service_name(self) -> str:
        return f"{self.name}-leaders"

    @property
    def router_name(self) -> str:
        return f"{self.name}-router"

    @property
    def router_peers_service_name(self) -> str:
        return f"{self.name}-router-peers"

    @property
    def endpoint(self) -> str:
        return f"http://{self.endpoint_service_name}.{self.namespace}.svc:{ROUTER_PORT}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidServer(Server):
    """A server that passed every check, the launch contract included: what `render` takes,
    and cannot fail on (`validate_server` makes it)."""

    contract: GroupContract  # replica group 0's; `launch_contract.for_replica` gives the others


def group_name(server: str, pd_role: str | None, index: int) -> str:
    """Group ``index`` of a plain server (``<server>-r<k>``) or of one of its roles
    (``<server>-p<k>``, ``<server>-d<k>``)."""
    prefix = "r" if pd_role is None else disaggregation.GROUP_PREFIX[pd_role]
    return f"{server}-{prefix}{index}"


def stable_hash(value: Any, length: int = 10) -> str:
    """A short, stable hash of a JSON-able value (templates, manifests)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]
