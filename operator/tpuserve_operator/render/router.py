"""The router in front of a server's leaders: Deployment, ConfigMap, RBAC, PDB, peering.

The router is configured only through its command line and environment (ARCHITECTURE §3):
it discovers the ready leaders of this server by label selector (`labels.leader_selector`)
in its namespace. The ConfigMap holds the discovery settings as the router's own
`TPUSERVE_ROUTER_<FLAG>` variables (read when the flag is not given); the pod template
carries the ConfigMap's hash, so a change rolls the router. What the server and the
operator leave unset (the policy, whether to subscribe to KV events) is not rendered at
all, so the router's own defaults apply: the operator never restates them. The readiness
probe is the router's `/readiness`, true only while it has a healthy worker: a ready router
pod means at least one routable replica. Probes use the metrics port, whose connections
no client can take.

Router replicas peer (docs/router.md, Several router replicas): each publishes its routing
decisions on `ROUTER_PEER_PORT` and subscribes to every address of the headless Service
`<name>-router-peers` (`--peers-from-dns`; it lists starting pods too, so a new replica is
heard from at once). Peering is rendered whatever the replica count, so the count (the
spec's, or an autoscaler's) never changes the pod template: scaling adds or removes replicas
without rolling the running ones, which keep what they know; one replica alone merely hears
no peer.

A replica that starts also asks its peers, in turn, for their KV-cache index, on the port
after the peer port (`ROUTER_PEER_SNAPSHOT_PORT`), so it routes as well as the others at once;
the first replica, or one whose peers have none yet, starts from the engines' replay. Both
peering ports need the replicas' shared secret (`--peer-key-file`, ZMQ CURVE): the Secret
`<name>-router-peering` (`router_peering_secret`), which the reconciler creates once with a
random value and never reads back; the NetworkPolicy also admits only the server's router
pods there.

What a proxy in the router's pod can reach is credentialed too: the admin API is served
without a key only on `ROUTER_ADMIN_PORT`, bound to 127.0.0.1 (`--admin-port`; reached with
`kubectl port-forward`), never on the pod's address. The router's budget of buffered request
bytes (`--max-buffered-bytes`) is a quarter of its container's memory limit, when it has one.
"""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any, Final

from kubernetes.utils.quantity import parse_quantity

from tpuserve_operator import host_kv, labels, rbac
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
    Server,
    stable_hash,
)
from tpuserve_operator.render.demand import demand_lease, hold_args, lease_rule
from tpuserve_operator.render.inference_pool import (
    picker_args,
    picker_container_ports,
    picker_token_volume,
)
from tpuserve_operator.render.network_policy import router_network_policy
from tpuserve_operator.render.pdb import router_disruption_budget
from tpuserve_operator.render.pod import termination
from tpuserve_operator.render.services import router_peers_service

ROUTER_CONTAINER = "router"
LIVENESS_PATH = "/health"
READINESS_PATH = "/readiness"
API_KEYS_DIR = "/etc/tpuserve/api-keys"
PEERING_DIR = "/etc/tpuserve/peering"
PEERING_KEY = "key"
BUFFER_SHARE_OF_MEMORY: Final = 4
"""The router's buffered request bytes may take a quarter of its memory limit (the rest: its
caches, bounded to 256 MiB, responses in flight, the interpreter)."""
MAX_REQUEST_BYTES: Final = 32 * 1024 * 1024
"""The router's --max-request-bytes default: a budget below it lowers that bound too (the
router refuses a budget smaller than the largest body it takes)."""
PROBE_PORT_NAME = "metrics"
"""Probes go to the router's metrics port: it has a connection budget of its own, so a
flood of client connections cannot fail the probes (docs/router.md, Limits)."""
ENV_POLICY = "TPUSERVE_ROUTER_POLICY"
ENV_SELECTOR = "TPUSERVE_ROUTER_SELECTOR"
ENV_NAMESPACE = "TPUSERVE_ROUTER_NAMESPACE"
CONFIG_HASH = f"{labels.GROUP}/config-hash"
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"


def router_policy(server: Server) -> str | None:
    """The server's policy, else the operator's --router-policy, else None (the router's)."""
    return server.valid.spec.router.policy or server.config.router_policy or None


def router_config(server: Server) -> Manifest:
    data = {
        ENV_NAMESPACE: server.namespace,
        ENV_SELECTOR: labels.selector_string(labels.leader_selector(server.name)),
    }
    policy = router_policy(server)
    if policy:
        data[ENV_POLICY] = policy
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": server.metadata(server.router_name, labels.COMPONENT_ROUTER),
        "data": data,
    }


def router_args(server: Server) -> list[str]:
    """Flags; namespace, selector and policy come from the ConfigMap's variables."""
    args = [
        "--host=0.0.0.0",
        f"--port={ROUTER_PORT}",
        f"--metrics-port={ROUTER_METRICS_PORT}",
        "--discovery=kubernetes",
        f"--request-timeout={server.valid.spec.router.max_request_seconds}",
        # after SIGTERM (and the preStop pause) requests in flight may finish: as the engines'
        f"--drain-seconds={termination(server).drain_seconds:g}",
    ]
    api_keys = server.valid.spec.router.api_keys
    if api_keys is not None:
        args.append(f"--api-keys-file={API_KEYS_DIR}/{api_keys.key}")
    args.append(f"--admin-port={ROUTER_ADMIN_PORT}")
    networks = server.config.router_worker_networks
    if networks:  # the pod network: nothing a pod or an engine names outside it is dialled
        args.append(f"--worker-networks={','.join(networks)}")
    args += buffer_args(_resources(server))
    args += peer_args(server)
    if server.valid.spec.engine.type == "sglang-jax":  # its load and prefixes, not SGLang's
        args.append("--engine-type=sglang-jax")
    kv_events = server.valid.spec.router.kv_events
    if kv_events is not None:  # unset: the router subscribes when its policy uses KV events
        args.append("--kv-events" if kv_events else "--no-kv-events")
    weight = host_kv.host_hit_weight(server.valid.spec, server.valid.shape)
    if weight is not None and router_policy(server) in host_kv.INDEX_POLICIES:
        # host-tier blocks weighed for this slice and model (docs/host-kv-tier.md)
        args.append(f"--policy-param=host_hit_weight={weight}")
    dis = server.valid.spec.disaggregation
    if dis is not None:  # pairs of the pods labelled with their role (docs/pd.md)
        args += ["--pd-disaggregation", f"--pd-policy={dis.policy}"]
    return args + hold_args(server) + picker_args(server)


def peer_args(server: Server) -> list[str]:
    """Peering with the other replicas (which also gives a starting replica a peer's KV
    snapshot, on the port after the peer port)."""
    peers = f"{server.router_peers_service_name}.{server.namespace}.svc"
    return [
        f"--peer-port={ROUTER_PEER_PORT}",
        f"--peers-from-dns={peers}",
        f"--peer-key-file={PEERING_DIR}/{PEERING_KEY}",
    ]


def buffer_args(resources: dict[str, Any]) -> list[str]:
    """``--max-buffered-bytes``: a quarter of the container's memory limit (none without a
    limit one can read: the router's own default applies)."""
    limit = (resources.get("limits") or {}).get("memory")
    try:
        memory = parse_quantity(limit) if limit is not None else None  # type: ignore[no-untyped-call]
    except ValueError:
        memory = None
    if memory is None or memory <= 0:
        return []
    budget = int(memory / BUFFER_SHARE_OF_MEMORY // Decimal(1))
    args = [f"--max-buffered-bytes={max(1024, budget)}"]
    if budget < MAX_REQUEST_BYTES:
        args.append(f"--max-request-bytes={max(1024, budget)}")
    return args


def router_peering_secret_name(server: Server) -> str:
    return f"{server.router_name}-peering"


def router_peering_secret(server: Server, secret: str) -> Manifest:
    """The replicas' shared peering secret (``secret``: random, made by the reconciler),
    owned by the server; created once, never applied again nor read back."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": server.metadata(router_peering_secret_name(server), labels.COMPONENT_ROUTER),
        "type": "Opaque",
        "data": {PEERING_KEY: base64.b64encode(secret.encode()).decode()},
    }


def _resources(server: Server) -> dict[str, Any]:
    own = server.valid.spec.router.resources
    return dict(own if own is not None else server.config.router_resources)


def router_deployment(server: Server, config: Manifest) -> Manifest:
    spec = server.valid.spec
    container: Manifest = {
        "name": ROUTER_CONTAINER,
        "image": spec.router.image or server.config.router_image,
        "command": ["tpuserve", "router"],
        "args": router_args(server),
        "envFrom": [{"configMapRef": {"name": server.router_name}}],
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
            {"name": ROUTER_PEER_PORT_NAME, "containerPort": ROUTER_PEER_PORT, "protocol": "TCP"},
            {
                "name": ROUTER_PEER_SNAPSHOT_PORT_NAME,
                "containerPort": ROUTER_PEER_SNAPSHOT_PORT,
                "protocol": "TCP",
            },
            *picker_container_ports(server),
        ],
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
        "resources": _resources(server),
        # Services and load balancers drop the terminating pod before it stops listening
        "lifecycle": {"preStop": {"sleep": {"seconds": termination(server).pre_stop_seconds}}},
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "peering", "mountPath": PEERING_DIR, "readOnly": True},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_labels = {**spec.template.labels, **labels.common(server.name, labels.COMPONENT_ROUTER)}
    annotations = {**spec.template.annotations, CONFIG_HASH: stable_hash(config["data"])}
    pod_spec: Manifest = {
        "serviceAccountName": server.router_name,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {
                "name": "peering",
                "secret": {
                    "secretName": router_peering_secret_name(server),
                    "items": [{"key": PEERING_KEY, "path": PEERING_KEY}],
                },
            },
        ],
        "affinity": _spread(server),
        # as long as the engines': requests in flight through it may take maxRequestSeconds
        "terminationGracePeriodSeconds": termination(server).grace_seconds,
    }
    token_mounts, token_volumes = picker_token_volume(server)
    container["volumeMounts"].extend(token_mounts)
    pod_spec["volumes"].extend(token_volumes)
    api_keys = spec.router.api_keys
    if api_keys is not None:  # a whole-Secret mount (no subPath), so updates reach the pod
        container["volumeMounts"].append(
            {"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True}
        )
        pod_spec["volumes"].append(
            {
                "name": "api-keys",
                "secret": {
                    "secretName": api_keys.secret_name,
                    "items": [{"key": api_keys.key, "path": api_keys.key}],
                },
            }
        )
    if spec.template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.template.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": server.metadata(server.router_name, labels.COMPONENT_ROUTER),
        "spec": {
            "replicas": spec.router.replicas or server.config.router_replicas,
            "selector": {"matchLabels": labels.router_selector(server.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def _spread(server: Server) -> Manifest:
    """Replicas on different nodes where the scheduler can (preferred, so a one-node cluster
    still runs them all): a node's loss then takes one replica, not the router."""
    term = {
        "labelSelector": {"matchLabels": labels.router_selector(server.name)},
        "topologyKey": HOSTNAME_TOPOLOGY_KEY,
    }
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": term}
            ]
        }
    }


def router_rbac(server: Server) -> list[Manifest]:
    """ServiceAccount, Role (read pods and EndpointSlices; renew the demand Lease when the
    server scales to zero) and RoleBinding for the router."""
    name = server.router_name
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": server.metadata(name, labels.COMPONENT_ROUTER),
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": server.metadata(name, labels.COMPONENT_ROUTER),
            "rules": [r.as_policy_rule() for r in rbac.ROUTER_RULES] + lease_rule(server),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": server.metadata(name, labels.COMPONENT_ROUTER),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": server.namespace}],
        },
    ]


def router_children(server: Server) -> list[Manifest]:
    if not server.valid.spec.router.enabled:
        return []
    config = router_config(server)
    return [
        *router_rbac(server),
        config,
        router_deployment(server, config),
        router_peers_service(server),
        *router_network_policy(server),
        *demand_lease(server),
        router_disruption_budget(server),
    ]
