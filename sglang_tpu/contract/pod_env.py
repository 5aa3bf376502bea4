"""What the operator puts on a model-server pod: the contract as a pod template's `env`.

Group values are literals; per-pod values (host index, replica index under LeaderWorkerSet,
pod name and IP) come from the downward API (`FieldRef`). `statefulset_hostnames` and
`lws_hostnames` build the `TPUSERVE_WORKER_HOSTNAMES` list of a group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_tpu.contract.env_names import REPLICA_PLACEHOLDER, Var
from sglang_tpu.contract.group_contract import GroupContract


@dataclass(frozen=True, slots=True)
class FieldRef:
    """A downward-API field of the pod (`valueFrom.fieldRef.fieldPath`)."""

    field_path: str


STATEFULSET_POD_INDEX = FieldRef("metadata.labels['apps.kubernetes.io/pod-index']")
LWS_WORKER_INDEX = FieldRef("metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']")
LWS_GROUP_INDEX = FieldRef("metadata.labels['leaderworkerset.sigs.k8s.io/group-index']")
LWS_GROUP_KEY = FieldRef("metadata.labels['leaderworkerset.sigs.k8s.io/group-key']")
JOB_COMPLETION_INDEX = FieldRef("metadata.annotations['batch.kubernetes.io/job-completion-index']")
POD_NAME = FieldRef("metadata.name")
POD_IP = FieldRef("status.podIP")


def statefulset_hostnames(
    statefulset: str, service: str, namespace: str, hosts: int
) -> tuple[str, ...]:
    """Stable names of a StatefulSet's pods behind the headless Service `service`."""
    return tuple(f"{statefulset}-{i}.{service}.{namespace}.svc" for i in range(hosts))


def lws_hostnames(lws: str, service: str, namespace: str, hosts: int) -> tuple[str, ...]:
    """Names of one LeaderWorkerSet group's pods (leader `<lws>-<g>`, workers `<lws>-<g>-<i>`).

    The group index is left as `{replica}`: one LWS pod template serves every group, and
    each pod fills in its own `TPUSERVE_REPLICA_INDEX` (see `pod_env(replica_index=...)`).
    """
    leader = f"{lws}-{REPLICA_PLACEHOLDER}"
    names = [leader] + [f"{leader}-{i}" for i in range(1, hosts)]
    return tuple(f"{n}.{service}.{namespace}.svc" for n in names)


def pod_env(
    group: GroupContract,
    *,
    host_index: FieldRef | int,
    replica_index: FieldRef | None = None,
    group_key: FieldRef | None = None,
) -> list[dict[str, Any]]:
    """The pod template's `env`: group values as literals, per-pod values from the pod.

    `TPU_WORKER_ID` is set from the same source as the host index so that the LWS webhook,
    which backs off when a container defines it, does not inject its own TPU variables.
    """

    def item(name: str, value: FieldRef | int | str) -> dict[str, Any]:
        if isinstance(value, FieldRef):
            return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": value.field_path}}}
        return {"name": name, "value": str(value)}

    if isinstance(host_index, int) and not 0 <= host_index < group.hosts:
        raise ValueError(f"host_index {host_index} is outside 0..{group.hosts - 1}")
    values = group.to_env()
    per_pod: dict[str, FieldRef | int | str] = {
        Var.HOST_INDEX.value: host_index,
        "TPU_WORKER_ID": host_index,
        Var.POD_NAME.value: POD_NAME,
        Var.POD_IP.value: POD_IP,
    }
    if replica_index is not None:
        per_pod[Var.REPLICA_INDEX.value] = replica_index
        values.pop(Var.REPLICA_INDEX.value, None)
    if group_key is not None:
        per_pod[Var.GROUP_KEY.value] = group_key
        values.pop(Var.GROUP_KEY.value, None)
    return [item(k, v) for k, v in values.items()] + [item(k, v) for k, v in per_pod.items()]
