"""Every label and annotation key the operator puts on objects, defined once.

These keys are contracts: the chart's PodMonitor copies `model`, `tpu-generation` and
`tpu-topology` into series labels (`podTargetLabels`), the router selects leaders by label,
and the recording rules join on them. docs/operator.md lists them (generated from here).
"""

from __future__ import annotations

from collections.abc import Mapping

GROUP = "serving.tpuserve.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TPUModelServer"
PLURAL = "tpumodelservers"
SINGULAR = "tpumodelserver"
SHORT_NAMES = ("tms",)
# An autoscaled role of a disaggregated TPUModelServer: the object its HPA scales.
ROLE_KIND = "TPUModelServerRole"
ROLE_PLURAL = "tpumodelserverroles"
ROLE_SINGULAR = "tpumodelserverrole"
ROLE_SHORT_NAMES = ("tmsrole",)
# One router in front of many servers of a namespace (gateway_api.py).
GATEWAY_KIND = "TPUGateway"
GATEWAY_PLURAL = "tpugateways"
GATEWAY_SINGULAR = "tpugateway"
GATEWAY_SHORT_NAMES = ("tgw",)

FIELD_MANAGER = "tpuserve-operator"

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF_VALUE = "tpuserve"
MANAGED_BY_VALUE = "tpuserve-operator"

COMPONENT_MODEL_SERVER = "model-server"
COMPONENT_ROUTER = "router"

# Series labels the chart's PodMonitor copies from pods (podTargetLabels).
MODEL = "model"
TPU_GENERATION = "tpu-generation"
TPU_TOPOLOGY = "tpu-topology"

REPLICA = f"{GROUP}/replica"
SLICE_GROUP = f"{GROUP}/group"  # the group's name: unique per replica group, slice placement
ROLE = f"{GROUP}/role"
ROLE_LEADER = "leader"
ROLE_WORKER = "worker"
REVISION = f"{GROUP}/revision"
SHARED_ROUTER = f"{GROUP}/shared-router"  # "true" on routers fronting several servers
GATEWAY = f"{GROUP}/gateway"  # the TPUGateway a gateway's objects belong to

# Annotations.
SPEC_HASH = f"{GROUP}/spec-hash"  # hash of the manifest the operator applied to a child
RESTARTED_AT = f"{GROUP}/restartedAt"  # set on a TPUModelServer to roll every group
SCALED_TO_ZERO = f"{GROUP}/scaled-to-zero"  # "true" while the operator holds a server at 0

LABEL_DOCS: Mapping[str, str] = {
    NAME: f"always `{PART_OF_VALUE}`",
    INSTANCE: "the TPUModelServer's name",
    COMPONENT: f"`{COMPONENT_MODEL_SERVER}` on engine pods, `{COMPONENT_ROUTER}` on router pods",
    MANAGED_BY: f"always `{MANAGED_BY_VALUE}`; the operator only watches objects carrying it",
    MODEL: "the served model name (engine pods); copied to series as `model`",
    TPU_GENERATION: "TPU generation, e.g. `v6e` (engine pods); copied to series",
    TPU_TOPOLOGY: "slice topology, e.g. `4x4` (engine pods); copied to series",
    REPLICA: "replica (slice) index of an engine pod's group, `0`..`replicas-1` (on a "
    "disaggregated server, within the pod's role: `serving.tpuserve.dev/pd-role`)",
    SLICE_GROUP: "`<name>-r<k>` (a disaggregated server's `<name>-p<k>` prefill and `<name>-d<k>` "
    "decode groups), unique per replica group: multi-host groups require all their "
    "pods in one node pool (one slice) and no other group's pods there",
    ROLE: f"`{ROLE_LEADER}` (host 0, serves HTTP, routable) or `{ROLE_WORKER}`",
    REVISION: "hash of the engine pod template; a group is updated when all its pods carry "
    "the TPUModelServer's current revision",
    SHARED_ROUTER: f"`true`, with `{COMPONENT}: {COMPONENT_ROUTER}`, on a router pod of your own "
    "that fronts several TPUModelServers of the namespace (docs/router.md, Many models): "
    "every server's engine NetworkPolicy lets it in, as it lets the server's own routers",
    GATEWAY: "the TPUGateway's name, on the objects the operator renders for it (its router "
    "pods carry `shared-router: true` too)",
}

ANNOTATION_DOCS: Mapping[str, str] = {
    RESTARTED_AT: "set on a TPUModelServer (any new value, e.g. a timestamp) to roll every "
    "replica group one at a time without a spec change",
    SPEC_HASH: "on every child: hash of the manifest the operator last applied",
    SCALED_TO_ZERO: "`true` on a TPUModelServer the operator scaled to zero (scale to zero); "
    "if scale to zero is turned off while it is at zero, the operator sets replicas back to "
    "max(1, minReplicas)",
}


def common(instance: str, component: str) -> dict[str, str]:
    """Labels every child of a TPUModelServer carries."""
    return {
        NAME: PART_OF_VALUE,
        INSTANCE: instance,
        COMPONENT: component,
        MANAGED_BY: MANAGED_BY_VALUE,
    }


def leader_selector(instance: str) -> dict[str, str]:
    """The one selector for routable engine pods: leaders (host 0) of this TPUModelServer.

    The router's `--selector`, the scale subresource's `status.selector` and the operator's
    replica metrics all use it.
    """
    return {
        INSTANCE: instance,
        COMPONENT: COMPONENT_MODEL_SERVER,
        ROLE: ROLE_LEADER,
    }


def group_selector(instance: str, replica: int) -> dict[str, str]:
    """All pods of one replica group (leader and workers)."""
    return {INSTANCE: instance, COMPONENT: COMPONENT_MODEL_SERVER, REPLICA: str(replica)}


def engine_selector(instance: str) -> dict[str, str]:
    return {INSTANCE: instance, COMPONENT: COMPONENT_MODEL_SERVER}


def router_selector(instance: str) -> dict[str, str]:
    return {INSTANCE: instance, COMPONENT: COMPONENT_ROUTER}


def shared_router_selector() -> dict[str, str]:
    """Router pods that front several servers of a namespace (not rendered by the operator)."""
    return {COMPONENT: COMPONENT_ROUTER, SHARED_ROUTER: "true"}


def selector_string(selector: Mapping[str, str]) -> str:
    """`k=v,k=v` as `--selector`, `kubectl -l` and `status.selector` spell it."""
    return ",".join(f"{k}={v}" for k, v in selector.items())
