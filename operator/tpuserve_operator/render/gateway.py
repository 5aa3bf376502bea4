"""A TPUGateway's objects: one router Deployment in front of the servers it selects.

The router is the per-server router (`render/router.py`: same command, probes, peering,
buffers, drain), configured for many models:

- discovery: every leader of an operator-managed model server in the namespace; each leader
  carries its server's served name as the ``model`` label, so it lands in its model's group,
  and ``--hold-models-only`` refuses (404) a model the gateway does not front;
- per model: ``--hold-models`` (each model's own hold queue of ``hold.maxRequests``),
  ``--hold-model-share`` (its share of the held bytes), ``--max-in-flight-per-model``, and,
  for a server with ``autoscaling.minReplicas: 0``, ``--demand-leases MODEL=<server>-demand``:
  its own requests renew its own Lease, which the server's reconciler reads as it reads a
  per-server router's (scale from zero and back, `scale_to_zero`);
- the Role names exactly those Leases (``resourceNames``), as a per-server router's names one.

Its pods carry ``serving.tpuserve.dev/shared-router: "true"``, which every server's engine
NetworkPolicy admits (`render/network_policy.py`). With ``spec.inferencePool`` the gateway is
also the endpoint picker of one InferencePool per model (docs/gateway.md).

The objects are owned by the TPUGateway (garbage collected with it) and labelled
``serving.tpuserve.dev/gateway: <name>``, not ``managed-by``: the servers' reconciler, which
watches what carries that label, does not take them for a server's children.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve_operator import labels, launch_contract, rbac
from tpuserve_operator.gateway_api import TPUGatewaySpec
from tpuserve_operator.render.context import (
    ROUTER_ADMIN_PORT,
    ROUTER_METRICS_PORT,
    ROUTER_PEER_PORT,
    ROUTER_PEER_PORT_NAME,
    ROUTER_PEER_SNAPSHOT_PORT,
    ROUTER_PEER_SNAPSHOT_PORT_NAME,
    ROUTER_PORT,
    RUN_AS_USER,
    Manifest,
    RenderConfig,
    stable_hash,
)
from tpuserve_operator.render.demand import DEMAND_INTERVAL_SECONDS
from tpuserve_operator.render.inference_pool import (
    APP_PROTOCOL,
    GROUP_VERSION,
    PICKER_PORT,
    PICKER_PORT_NAME,
)
from tpuserve_operator.render.inference_pool import KIND as POOL_KIND
from tpuserve_operator.render.router import (
    API_KEYS_DIR,
    LIVENESS_PATH,
    PEERING_DIR,
    PEERING_KEY,
    PROBE_PORT_NAME,
    READINESS_PATH,
    ROUTER_CONTAINER,
    buffer_args,
)

PRE_STOP_SECONDS = 5
KILL_MARGIN_SECONDS = 5
GATEWAY_LABEL = "gateway.networking.k8s.io/gateway-name"


@dataclass(frozen=True, slots=True)
class GatewayModel:
    """One selected server, as the gateway fronts it."""

    server: str
    model: str  # its served name
    lease: str | None  # its demand Lease when it scales to zero


@dataclass(frozen=True, slots=True)
class Gateway:
    name: str
    namespace: str
    spec: TPUGatewaySpec
    config: RenderConfig
    models: tuple[GatewayModel, ...]
    uid: str | None = None

    @property
    def router_name(self) -> str:
        return f"{self.name}-gateway"

    @property
    def peers_name(self) -> str:
        return f"{self.name}-gateway-peers"

    @property
    def peering_secret_name(self) -> str:
        return f"{self.name}-gateway-peering"

    @property
    def picker_name(self) -> str:
        return f"{self.name}-gateway-picker"

    def selector(self) -> dict[str, str]:
        return {labels.GATEWAY: self.name, labels.COMPONENT: labels.COMPONENT_ROUTER}

    def metadata(self, name: str) -> Manifest:
        meta: Manifest = {
            "name": name,
            "namespace": self.namespace,
            "labels": {
                labels.NAME: labels.PART_OF_VALUE,
                labels.INSTANCE: self.name,
                labels.COMPONENT: labels.COMPONENT_ROUTER,
                labels.GATEWAY: self.name,
            },
        }
        if self.uid is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": labels.API_VERSION,
                    "kind": labels.GATEWAY_KIND,
                    "name": self.name,
                    "uid": self.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return meta


def selects(selector: Mapping[str, str], server_labels: Mapping[str, str]) -> bool:
    """Whether a server with ``server_labels`` is one of the gateway's (matchLabels)."""
    return all(server_labels.get(k) == v for k, v in selector.items())


def discovery_selector() -> str:
    """Every leader of an operator-managed model server in the namespace."""
    return labels.selector_string(
        {
            labels.COMPONENT: labels.COMPONENT_MODEL_SERVER,
            labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
            labels.ROLE: labels.ROLE_LEADER,
        }
    )


def _resources(gateway: Gateway) -> dict[str, Any]:
    own = gateway.spec.resources
    return dict(own if own is not None else gateway.config.router_resources)


def gateway_args(gateway: Gateway) -> list[str]:
    spec = gateway.spec
    models = sorted(m.model for m in gateway.models)
    leases = sorted(f"{m.model}={m.lease}" for m in gateway.models if m.lease is not None)
    drain = spec.max_request_seconds
    args = [
        "--host=0.0.0.0",
        f"--port={ROUTER_PORT}",
        f"--metrics-port={ROUTER_METRICS_PORT}",
        "--discovery=kubernetes",
        f"--request-timeout={spec.max_request_seconds}",
        f"--drain-seconds={drain}",
        f"--admin-port={ROUTER_ADMIN_PORT}",
    ]
    if spec.api_keys is not None:
        args.append(f"--api-keys-file={API_KEYS_DIR}/{spec.api_keys.key}")
    networks = gateway.config.router_worker_networks
    if networks:
        args.append(f"--worker-networks={','.join(networks)}")
    args += buffer_args(_resources(gateway))
    args += [
        f"--peer-port={ROUTER_PEER_PORT}",
        f"--peers-from-dns={gateway.peers_name}.{gateway.namespace}.svc",
        f"--peer-key-file={PEERING_DIR}/{PEERING_KEY}",
        f"--hold-max-requests={spec.hold.max_requests}",
        f"--hold-max-seconds={spec.hold.max_seconds}",
        f"--hold-model-share={spec.hold.model_share:g}",
        f"--max-in-flight-per-model={spec.max_in_flight_per_model}",
        "--hold-models-only",
    ]
    if models:
        args.append(f"--hold-models={','.join(models)}")
    if leases:
        args += [
            f"--demand-leases={','.join(leases)}",
            f"--demand-interval={DEMAND_INTERVAL_SECONDS}",
        ]
    if spec.inference_pool is not None:  # fenced by the NetworkPolicy: the gateway's pods only
        args += [f"--picker-port={PICKER_PORT}", "--picker-tls", "--picker-no-token"]
    return args


def _env(gateway: Gateway) -> list[Manifest]:
    env = [
        {"name": "TPUSERVE_ROUTER_NAMESPACE", "value": gateway.namespace},
        {"name": "TPUSERVE_ROUTER_SELECTOR", "value": discovery_selector()},
    ]
    policy = gateway.spec.policy or gateway.config.router_policy
    if policy:
        env.append({"name": "TPUSERVE_ROUTER_POLICY", "value": policy})
    return env


def gateway_deployment(gateway: Gateway) -> Manifest:
    spec = gateway.spec
    ports: list[Manifest] = [
        {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
        {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        {"name": ROUTER_PEER_PORT_NAME, "containerPort": ROUTER_PEER_PORT, "protocol": "TCP"},
        {
            "name": ROUTER_PEER_SNAPSHOT_PORT_NAME,
            "containerPort": ROUTER_PEER_SNAPSHOT_PORT,
            "protocol": "TCP",
        },
    ]
    if spec.inference_pool is not None:
        ports.append({"name": PICKER_PORT_NAME, "containerPort": PICKER_PORT, "protocol": "TCP"})
    mounts: list[Manifest] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "peering", "mountPath": PEERING_DIR, "readOnly": True},
    ]
    volumes: list[Manifest] = [
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "peering",
            "secret": {
                "secretName": gateway.peering_secret_name,
                "items": [{"key": PEERING_KEY, "path": PEERING_KEY}],
            },
        },
    ]
    if spec.api_keys is not None:
        mounts.append({"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "api-keys",
                "secret": {
                    "secretName": spec.api_keys.secret_name,
                    "items": [{"key": spec.api_keys.key, "path": spec.api_keys.key}],
                },
            }
        )
    container: Manifest = {
        "name": ROUTER_CONTAINER,
        "image": spec.image or gateway.config.router_image,
        "command": ["tpuserve", "router"],
        "args": gateway_args(gateway),
        "env": _env(gateway),
        "ports": ports,
        "readinessProbe": {
            "httpGet": {"path": READINESS_PATH, "port": PROBE_PORT_NAME},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": LIVENESS_PATH, "port": PROBE_PORT_NAME},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "resources": _resources(gateway),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_labels = {
        **gateway.metadata("")["labels"],
        labels.SHARED_ROUTER: "true",
    }
    term = {
        "labelSelector": {"matchLabels": gateway.selector()},
        "topologyKey": "kubernetes.io/hostname",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": gateway.metadata(gateway.router_name),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": gateway.selector()},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {f"{labels.GROUP}/config-hash": stable_hash(container["args"])},
                },
                "spec": {
                    "serviceAccountName": gateway.router_name,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "runAsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 100, "podAffinityTerm": term}
                            ]
                        }
                    },
                    "terminationGracePeriodSeconds": PRE_STOP_SECONDS
                    + spec.max_request_seconds
                    + KILL_MARGIN_SECONDS,
                },
            },
        },
    }


def gateway_rbac(gateway: Gateway) -> list[Manifest]:
    """Read pods and EndpointSlices; renew exactly the selected servers' demand Leases."""
    name = gateway.router_name
    leases = sorted(m.lease for m in gateway.models if m.lease is not None)
    lease_rules = (
        [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": leases,
                "verbs": ["get", "patch"],
            }
        ]
        if leases
        else []
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": gateway.metadata(name),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": gateway.metadata(name),
            "rules": [r.as_policy_rule() for r in rbac.ROUTER_RULES] + lease_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": gateway.metadata(name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": gateway.namespace}],
        },
    ]


def gateway_services(gateway: Gateway) -> list[Manifest]:
    """The clients' Service and the headless peers' Service."""
    out: list[Manifest] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": gateway.metadata(gateway.router_name),
            "spec": {
                "type": gateway.spec.service_type,
                "selector": gateway.selector(),
                "ports": [
                    {"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"},
                    {
                        "name": "metrics",
                        "port": ROUTER_METRICS_PORT,
                        "targetPort": "metrics",
                        "protocol": "TCP",
                    },
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": gateway.metadata(gateway.peers_name),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": gateway.selector(),
                "ports": [
                    {
                        "name": ROUTER_PEER_PORT_NAME,
                        "port": ROUTER_PEER_PORT,
                        "targetPort": ROUTER_PEER_PORT_NAME,
                        "protocol": "TCP",
                    },
                    {
                        "name": ROUTER_PEER_SNAPSHOT_PORT_NAME,
                        "port": ROUTER_PEER_SNAPSHOT_PORT,
                        "targetPort": ROUTER_PEER_SNAPSHOT_PORT_NAME,
                        "protocol": "TCP",
                    },
                ],
            },
        },
    ]
    if gateway.spec.inference_pool is not None:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": gateway.metadata(gateway.picker_name),
                "spec": {
                    "selector": gateway.selector(),
                    "ports": [
                        {
                            "name": PICKER_PORT_NAME,
                            "port": PICKER_PORT,
                            "targetPort": PICKER_PORT_NAME,
                            "protocol": "TCP",
                            "appProtocol": APP_PROTOCOL,
                        }
                    ],
                },
            }
        )
    return out


def _ports(*numbers: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": n} for n in numbers]


def gateway_network_policies(gateway: Gateway) -> list[Manifest]:
    """The peer ports from the gateway's own pods alone; with pools, the picker port and the
    selected servers' leaders' HTTP port from the named Gateway's pods (policies add up: the
    servers' own engine policies stay as they are)."""
    if gateway.config.network_policy == "none":
        return []
    pool = gateway.spec.inference_pool
    gateway_pods = (
        [{"podSelector": {"matchLabels": {GATEWAY_LABEL: pool.gateway_name}}}] if pool else []
    )
    ingress: list[Manifest] = [
        {"ports": _ports(ROUTER_PORT, ROUTER_METRICS_PORT)},
        {
            "from": [{"podSelector": {"matchLabels": gateway.selector()}}],
            "ports": _ports(ROUTER_PEER_PORT, ROUTER_PEER_SNAPSHOT_PORT),
        },
    ]
    if gateway_pods:
        ingress.append({"from": gateway_pods, "ports": _ports(PICKER_PORT)})
    out: list[Manifest] = [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": gateway.metadata(gateway.router_name),
            "spec": {
                "podSelector": {"matchLabels": gateway.selector()},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }
    ]
    servers = sorted(m.server for m in gateway.models)
    if gateway_pods and servers:
        out.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": gateway.metadata(f"{gateway.router_name}-engines"),
                "spec": {
                    "podSelector": {
                        "matchLabels": {labels.COMPONENT: labels.COMPONENT_MODEL_SERVER},
                        "matchExpressions": [
                            {"key": labels.INSTANCE, "operator": "In", "values": servers}
                        ],
                    },
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": gateway_pods, "ports": _ports(launch_contract.HTTP_PORT)}],
                },
            }
        )
    return out


def inference_pools(gateway: Gateway) -> list[Manifest]:
    """One pool per model, its picker this gateway (none without spec.inferencePool)."""
    pool = gateway.spec.inference_pool
    if pool is None:
        return []
    return [
        {
            "apiVersion": GROUP_VERSION,
            "kind": POOL_KIND,
            "metadata": gateway.metadata(pool_name(gateway, m)),
            "spec": {
                "selector": {"matchLabels": labels.leader_selector(m.server)},
                "targetPorts": [{"number": launch_contract.HTTP_PORT}],
                "endpointPickerRef": {
                    "group": "",
                    "kind": "Service",
                    "name": gateway.picker_name,
                    "port": {"number": PICKER_PORT},
                    "failureMode": pool.failure_mode,
                },
            },
        }
        for m in sorted(gateway.models, key=lambda m: m.server)
    ]


def pool_name(gateway: Gateway, model: GatewayModel) -> str:
    return f"{gateway.name}-{model.server}"


def disruption_budget(gateway: Gateway) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": gateway.metadata(gateway.router_name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": gateway.selector()}},
    }


def peering_secret(gateway: Gateway, secret: str) -> Manifest:
    """The replicas' shared peering key (random, made once by the handler, never read)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": gateway.metadata(gateway.peering_secret_name),
        "type": "Opaque",
        "data": {PEERING_KEY: base64.b64encode(secret.encode()).decode()},
    }


def gateway_children(gateway: Gateway) -> list[Manifest]:
    """Everything applied for the gateway (its peering Secret aside: created once)."""
    return [
        *gateway_rbac(gateway),
        gateway_deployment(gateway),
        *gateway_services(gateway),
        *gateway_network_policies(gateway),
        disruption_budget(gateway),
        *inference_pools(gateway),
    ]


def gateway_models(
    selector: Mapping[str, str], servers: Sequence[Mapping[str, Any]]
) -> tuple[tuple[GatewayModel, ...], list[str]]:
    """The selected servers as models (served name: the status's, else the spec's), with
    their demand Lease when they scale to zero; and the selected servers left out because
    another (first by name) serves the same model. A server whose served name is not known
    yet (not reconciled) is left for a later pass."""
    out: dict[str, GatewayModel] = {}
    duplicates = []
    for body in sorted(servers, key=lambda b: str((b.get("metadata") or {}).get("name"))):
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp") or not selects(selector, meta.get("labels") or {}):
            continue
        spec = body.get("spec") or {}
        name = str(meta.get("name"))
        served = (body.get("status") or {}).get("servedName") or (spec.get("model") or {}).get(
            "servedName"
        )
        if not served:
            continue
        if served in out:
            duplicates.append(name)
            continue
        zero = (spec.get("autoscaling") or {}).get("minReplicas", 1) == 0
        out[str(served)] = GatewayModel(name, str(served), f"{name}-demand" if zero else None)
    return tuple(sorted(out.values(), key=lambda m: m.server)), duplicates
