"""A server behind a Gateway API Inference Extension gateway: its InferencePool and the
Service of its endpoint picker (``spec.inferencePool``; docs/gateway.md).

The pool (``inference.networking.k8s.io/v1``, named after the server) selects the server's
serving leaders (`labels.leader_selector`: host 0 of each replica group, the pods that
serve HTTP; a multi-host slice's other hosts never do) on the engine's HTTP port, and names
the router as its endpoint picker: the Service ``<name>-picker`` on `PICKER_PORT`, in front of
the router pods, which run ``tpuserve router --picker-port --picker-tls`` (the Endpoint
Picker protocol, Envoy ext_proc over gRPC, TLS with a self-signed certificate as the
reference picker serves it). ``failureMode`` comes from the spec.

The gateway dials the endpoints the picker names, so the engines' NetworkPolicy admits the
gateway's own pods (``gatewayName``: those labelled `GATEWAY_POD_LABEL` with its name, in
``gatewayNamespace``, by default the server's own namespace; or the ``gatewayFrom`` peers,
each a podSelector or an ipBlock; never any source, never a whole namespace) on the HTTP
port, and the router's admits them on the picker port. With ``pickerAuth: Token`` (the
default) the router's pods mount the gateway's token read-only (``tokenSecretRef``, else the
Secret `picker_secret_name` the reconciler creates once with a random value) and run with
``--picker-token-file``: a stream without it is refused. ``NetworkPolicyOnly`` renders
``--picker-no-token``: the explicit opt-out for gateways that cannot send a token.

A pool of that name which the operator did not create is never applied nor deleted
(`tpuserve_operator.gateway`): shared ownership, as the Inference Extension asks of
controllers.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from typing import Any, Final

from tpuserve_operator import labels, launch_contract
from tpuserve_operator.api import GATEWAY_POD_LABEL, SecretKeyRef
from tpuserve_operator.errors import Problem
from tpuserve_operator.render.context import Manifest, RenderConfig, Server

GROUP: Final = "inference.networking.k8s.io"
VERSION: Final = "v1"
GROUP_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "InferencePool"
PLURAL: Final = "inferencepools"
PICKER_PORT: Final = 9002
"""The router's picker port (`tpuserve router --picker-port`), the reference picker's."""
PICKER_PORT_NAME: Final = "picker"
PICKER_TOKEN_DIR: Final = "/etc/tpuserve/picker"
PICKER_TOKEN_VOLUME: Final = "picker-token"
PICKER_TOKEN_KEY: Final = "token"
"""The key of the picker's token in the Secret the operator creates."""
APP_PROTOCOL: Final = "http2"
"""The picker Service port's appProtocol, as the Inference Extension's own picker Services
have it (gRPC over TLS: the router runs with --picker-tls)."""
FIELD: Final = "spec.inferencePool"
NEEDS_ROUTER: Final = (
    "needs the router (its endpoint picker); router.enabled is false; allowed: router.enabled "
    "true, or no inferencePool"
)
NO_CRD: Final = (
    f"the cluster does not serve {GROUP_VERSION} {KIND} (the Gateway API Inference Extension's "
    "CRDs are not installed); allowed: unset, or install those CRDs"
)
WITH_DISAGGREGATION: Final = (
    "is not allowed with spec.disaggregation: a gateway sends each request to the one endpoint "
    "the picker names, and neither a prefill nor a decode engine serves a request alone (the "
    "router's own HTTP port sends both legs of a pair; docs/pd.md); allowed: spec.inferencePool "
    "or spec.disaggregation, not both"
)
CLUSTER_PARAM: Final = "cluster.inferencePool"
"""The admission policy's parameter saying whether the cluster serves InferencePools ("true"
or "false", written by the chart from the API versions it sees; absent: not checked)."""


ParentView = tuple[str, bool, str, str]
"""(namespace/name of the Gateway, Accepted is True, its reason, its message)."""


def parents_of(body: Mapping[str, Any]) -> tuple[ParentView, ...]:
    """What the gateways report in an InferencePool's ``status.parents``."""
    status = body.get("status") or {}
    found: list[ParentView] = []
    for parent in (status.get("parents") or [])[:32] if isinstance(status, dict) else []:
        if not isinstance(parent, dict):
            continue
        ref = parent.get("parentRef") or {}
        name = str(ref.get("name") or "")
        namespace = ref.get("namespace") or (body.get("metadata") or {}).get("namespace") or ""
        accepted = next(
            (c for c in parent.get("conditions") or [] if c.get("type") == "Accepted"), None
        )
        found.append(
            (
                f"{namespace}/{name}",
                bool(accepted and accepted.get("status") == "True"),
                str((accepted or {}).get("reason") or ""),
                str((accepted or {}).get("message") or "")[:1024],
            )
        )
    return tuple(found)


def wants_pool(server: Server) -> bool:
    return server.valid.spec.inference_pool is not None


def picker_service_name(server: Server) -> str:
    return f"{server.name}-picker"


def pool_problems(
    spec_pool: object, router_enabled: bool, config: RenderConfig, disaggregated: bool = False
) -> list[Problem]:
    """What makes ``spec.inferencePool`` impossible: no router to pick, a cluster that does
    not serve the InferencePool API (the CRD is not installed), or prefill/decode roles
    (``disaggregated``: spec.disaggregation), whose engines a gateway cannot send to alone."""
    if spec_pool is None:
        return []
    problems = []
    if not router_enabled:
        problems.append(Problem(FIELD, NEEDS_ROUTER))
    if not config.inference_pool:
        problems.append(Problem(FIELD, NO_CRD))
    if disaggregated:
        problems.append(Problem(FIELD, WITH_DISAGGREGATION))
    return problems


def inference_pool(server: Server) -> Manifest:
    pool = server.valid.spec.inference_pool
    assert pool is not None
    return {
        "apiVersion": GROUP_VERSION,
        "kind": KIND,
        "metadata": server.metadata(server.name, labels.COMPONENT_ROUTER),
        "spec": {
            "selector": {"matchLabels": labels.leader_selector(server.name)},
            "targetPorts": [{"number": launch_contract.HTTP_PORT}],
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": picker_service_name(server),
                "port": {"number": PICKER_PORT},
                "failureMode": pool.failure_mode,
            },
        },
    }


def picker_service(server: Server) -> Manifest:
    """``<name>-picker``: the router pods' picker port, what the pool's endpointPickerRef
    names."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": server.metadata(picker_service_name(server), labels.COMPONENT_ROUTER),
        "spec": {
            "selector": labels.router_selector(server.name),
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


def pool_children(server: Server) -> list[Manifest]:
    """The pool and its picker's Service, when the spec asks for them."""
    if not wants_pool(server):
        return []
    return [inference_pool(server), picker_service(server)]


def picker_args(server: Server) -> list[str]:
    """The router's flags turning its picker on, with TLS (a self-signed certificate, which
    gateways dial without verifying, as they dial the Inference Extension's own pickers),
    and the gateway's token file when ``tokenSecretRef`` names one."""
    if not wants_pool(server):
        return []
    args = [f"--picker-port={PICKER_PORT}", "--picker-tls"]
    token = _token_ref(server)
    if token is not None:
        args.append(f"--picker-token-file={PICKER_TOKEN_DIR}/{token.key}")
    else:  # NetworkPolicyOnly: the explicit opt-out; the NetworkPolicy keeps the port
        args.append("--picker-no-token")
    return args


def picker_secret_name(server: Server) -> str:
    return f"{server.router_name}-picker"


def wants_picker_secret(server: Server) -> bool:
    """The operator creates the picker's token Secret: a pool with ``pickerAuth: Token`` and
    no ``tokenSecretRef``."""
    pool = server.valid.spec.inference_pool
    return pool is not None and pool.picker_auth == "Token" and pool.token_secret_ref is None


def picker_secret(server: Server, token: str) -> Manifest:
    """The gateway's token (``token``: random, made by the reconciler), owned by the server;
    created once, never applied again nor read back by the operator (the gateway's
    configuration reads it: an Envoy's ext_proc ``initial_metadata``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": server.metadata(picker_secret_name(server), labels.COMPONENT_ROUTER),
        "type": "Opaque",
        "data": {PICKER_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def picker_token_volume(server: Server) -> tuple[list[Manifest], list[Manifest]]:
    """The router container's mount and the pod's volume of the gateway's token (the key of
    ``tokenSecretRef`` alone, read-only), or none."""
    token = _token_ref(server)
    if not wants_pool(server) or token is None:
        return [], []
    mount = {"name": PICKER_TOKEN_VOLUME, "mountPath": PICKER_TOKEN_DIR, "readOnly": True}
    volume = {
        "name": PICKER_TOKEN_VOLUME,
        "secret": {
            "secretName": token.name,
            "items": [{"key": token.key, "path": token.key}],
        },
    }
    return [mount], [volume]


def _token_ref(server: Server) -> SecretKeyRef | None:
    """The Secret key of the picker's token: ``tokenSecretRef``, else the operator's own
    Secret; None with ``pickerAuth: NetworkPolicyOnly`` (or no pool)."""
    pool = server.valid.spec.inference_pool
    if pool is None or pool.picker_auth != "Token":
        return None
    if pool.token_secret_ref is not None:
        return pool.token_secret_ref
    return SecretKeyRef(name=picker_secret_name(server), key=PICKER_TOKEN_KEY)


def picker_container_ports(server: Server) -> list[Manifest]:
    if not wants_pool(server):
        return []
    return [{"name": PICKER_PORT_NAME, "containerPort": PICKER_PORT, "protocol": "TCP"}]


def _gateway_peers(server: Server) -> list[Manifest]:
    """The spec's gatewayFrom peers, else the pods of gatewayName (labelled
    `GATEWAY_POD_LABEL`) in gatewayNamespace (default: the server's own): never any source
    (issue 57, item 6), never a whole namespace (issue 68)."""
    pool = server.valid.spec.inference_pool
    if pool is not None and pool.gateway_from:
        return [copy.deepcopy(dict(peer)) for peer in pool.gateway_from]
    # the CRD's GATEWAY_NAMED_RULE (checked before rendering): never an empty "from"
    assert pool is not None
    assert pool.gateway_name is not None
    namespace = pool.gateway_namespace or server.namespace
    return [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": {GATEWAY_POD_LABEL: pool.gateway_name}},
        }
    ]


def engine_ingress(server: Server) -> list[Manifest]:
    """The engines' NetworkPolicy rule admitting the gateway to the leaders' HTTP port."""
    if not wants_pool(server):
        return []
    return [
        {
            "from": _gateway_peers(server),
            "ports": [{"protocol": "TCP", "port": launch_contract.HTTP_PORT}],
        }
    ]


def router_ingress(server: Server) -> list[Manifest]:
    """The router's NetworkPolicy rule admitting the gateway to the picker port."""
    if not wants_pool(server):
        return []
    return [{"from": _gateway_peers(server), "ports": [{"protocol": "TCP", "port": PICKER_PORT}]}]
