"""What the operator knows about children and pods: compact views kept from watch events.

The operator watches its children and pods (server-side filtered by the managed-by label)
and keeps only what status, rollouts and drift detection need, grouped by the server
(namespace, instance label). `pod_view` and `child_view` are pure; `ObservedCache` is the
in-memory store the kopf event handlers fill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sglang_tpu import disaggregation as pd
from sglang_tpu import preflight
from tpuserve_operator import disaggregation, labels
from tpuserve_operator.engine_resources import quantity
from tpuserve_operator.render.inference_pool import ParentView, parents_of

ServerKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    replica: int | None  # its group's key (`disaggregation.group_key`), None: not a group's
    role: str
    revision: str
    phase: str
    ready: bool
    running: bool
    deleting: bool
    unschedulable: str | None  # the scheduler's message when PodScheduled=False/Unschedulable
    crash_loop: str | None  # "container: message" when a container is in CrashLoopBackOff
    restarts: int
    created: str
    uid: str = ""
    node: str = ""  # spec.nodeName once scheduled
    ip: str = ""  # status.podIP, once it has one
    # (reason, "container: message") when a container's launcher refused to start: it exited
    # with the pre-flight's status and its termination message names a pre-flight reason
    preflight_failure: tuple[str, str] | None = None
    pd_contract: str = ""  # a disaggregated server's pairing contract label (`disaggregation`)


@dataclass(frozen=True, slots=True)
class ChildView:
    api_version: str
    kind: str
    name: str
    uid: str
    owner_uid: str | None
    generation: int | None
    resource_version: str
    spec_hash: str | None
    revision: str | None
    replica: int | None  # its group's key, as PodView's
    deleting: bool
    ready_replicas: int  # Deployments/StatefulSets: status.readyReplicas; others 0
    created: str = ""  # metadata.creationTimestamp
    renewed: str | None = None  # Leases: spec.renewTime (the routers' demand signal)
    parents: tuple[ParentView, ...] = ()  # InferencePools: what the gateways report (gateway.py)
    # TPUModelServerRoles: spec.replicas (what its HPA set), status (replicas, selector)
    desired: int | None = None
    scale_status: tuple[int | None, str] | None = None
    # HorizontalPodAutoscalers (KEDA's, for the predictive floor's status): status.currentMetrics'
    # External metrics as (name, current averageValue or value), and status.currentReplicas
    external_metrics: tuple[tuple[str, float], ...] = ()
    current_replicas: int | None = None

    @property
    def ref(self) -> tuple[str, str]:
        return (self.kind, self.name)


def _condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def pod_view(body: Mapping[str, Any]) -> PodView:
    meta = body.get("metadata") or {}
    pod_labels = meta.get("labels") or {}
    status = body.get("status") or {}
    conditions = status.get("conditions") or []
    ready = _condition(conditions, "Ready")
    scheduled = _condition(conditions, "PodScheduled")
    unschedulable = None
    if (
        scheduled
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    ):
        unschedulable = str(scheduled.get("message") or "unschedulable")
    crash_loop = None
    preflight_failure = None
    restarts = 0
    for cs in status.get("containerStatuses") or []:
        restarts += int(cs.get("restartCount") or 0)
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff" and crash_loop is None:
            crash_loop = f"{cs.get('name')}: {waiting.get('message') or 'CrashLoopBackOff'}"
        if preflight_failure is None:
            preflight_failure = _preflight_failure(cs)
    return PodView(
        name=str(meta.get("name")),
        replica=disaggregation.key_of_labels(
            pod_labels, _int_or_none(pod_labels.get(labels.REPLICA))
        ),
        role=str(pod_labels.get(labels.ROLE, "")),
        revision=str(pod_labels.get(labels.REVISION, "")),
        phase=str(status.get("phase") or "Pending"),
        ready=bool(ready and ready.get("status") == "True"),
        running=status.get("phase") == "Running",
        deleting=meta.get("deletionTimestamp") is not None,
        unschedulable=unschedulable,
        crash_loop=crash_loop,
        restarts=restarts,
        created=str(meta.get("creationTimestamp") or ""),
        uid=str(meta.get("uid") or ""),
        node=str((body.get("spec") or {}).get("nodeName") or ""),
        ip=str(status.get("podIP") or ""),
        preflight_failure=preflight_failure,
        pd_contract=str(pod_labels.get(pd.PD_CONTRACT_LABEL, "")),
    )


def _preflight_failure(container_status: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, "container: message") when the container, not running now, last exited
    because the launcher's pre-flight failed; None otherwise."""
    state = container_status.get("state") or {}
    if "running" in state:
        return None  # it started since: that pre-flight passed
    terminated = state.get("terminated") or (container_status.get("lastState") or {}).get(
        "terminated"
    )
    if not terminated or terminated.get("exitCode") != preflight.EXIT_PREFLIGHT_FAILED:
        return None
    parsed = preflight.parse_termination_message(str(terminated.get("message") or ""))
    if parsed is None:
        return None
    reason, message = parsed
    return str(reason), f"{container_status.get('name')}: {message}"


def child_view(body: Mapping[str, Any]) -> ChildView:
    meta = body.get("metadata") or {}
    child_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    owners = meta.get("ownerReferences") or []
    controller = next((o for o in owners if o.get("controller")), None)
    status = body.get("status") or {}
    return ChildView(
        api_version=str(body.get("apiVersion")),
        kind=str(body.get("kind")),
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        owner_uid=controller.get("uid") if controller else None,
        generation=_int_or_none(meta.get("generation")),
        resource_version=str(meta.get("resourceVersion") or ""),
        spec_hash=annotations.get(labels.SPEC_HASH),
        revision=annotations.get(labels.REVISION),
        replica=disaggregation.key_of_labels(
            child_labels, _int_or_none(child_labels.get(labels.REPLICA))
        ),
        deleting=meta.get("deletionTimestamp") is not None,
        ready_replicas=int(status.get("readyReplicas") or 0) if isinstance(status, dict) else 0,
        created=str(meta.get("creationTimestamp") or ""),
        renewed=(body.get("spec") or {}).get("renewTime") if body.get("kind") == "Lease" else None,
        parents=parents_of(body) if body.get("kind") == "InferencePool" else (),
        **_role_scale(body),
        **_hpa_metrics(body),
    )


def _hpa_metrics(body: Mapping[str, Any]) -> dict[str, Any]:
    if body.get("kind") != "HorizontalPodAutoscaler":
        return {}
    status = body.get("status") or {}
    if not isinstance(status, Mapping):
        return {}
    out = []
    for metric in status.get("currentMetrics") or ():
        external = metric.get("external") if isinstance(metric, Mapping) else None
        if not isinstance(external, Mapping):
            continue
        name = (external.get("metric") or {}).get("name")
        current = external.get("current") or {}
        amount = quantity(current.get("averageValue", current.get("value")))
        if name and amount is not None:
            out.append((str(name), float(amount)))
    return {
        "external_metrics": tuple(out),
        "current_replicas": _int_or_none(status.get("currentReplicas")),
    }


def _role_scale(body: Mapping[str, Any]) -> dict[str, Any]:
    if body.get("kind") != labels.ROLE_KIND:
        return {}
    status = body.get("status") or {}
    return {
        "desired": _int_or_none((body.get("spec") or {}).get("replicas")),
        "scale_status": (_int_or_none(status.get("replicas")), str(status.get("selector") or "")),
    }


def server_key_of(body: Mapping[str, Any]) -> ServerKey | None:
    """The server a child or pod belongs to, from its namespace and instance label."""
    meta = body.get("metadata") or {}
    instance = (meta.get("labels") or {}).get(labels.INSTANCE)
    namespace = meta.get("namespace")
    if not instance or not namespace:
        return None
    return (str(namespace), str(instance))


@dataclass(slots=True)
class _Entry:
    children: dict[tuple[str, str], ChildView]
    pods: dict[str, PodView]


class ObservedCache:
    """Children and pods per server, as last seen on the watch streams."""

    def __init__(self) -> None:
        self._entries: dict[ServerKey, _Entry] = {}

    def _entry(self, key: ServerKey) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(children={}, pods={})
        return entry

    def put_child(self, key: ServerKey, view: ChildView) -> None:
        self._entry(key).children[view.ref] = view

    def drop_child(self, key: ServerKey, kind: str, name: str) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.children.pop((kind, name), None)

    def put_pod(self, key: ServerKey, view: PodView) -> None:
        self._entry(key).pods[view.name] = view

    def drop_pod(self, key: ServerKey, name: str) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.pods.pop(name, None)

    def children(self, key: ServerKey) -> dict[tuple[str, str], ChildView]:
        entry = self._entries.get(key)
        return dict(entry.children) if entry else {}

    def pods(self, key: ServerKey) -> list[PodView]:
        entry = self._entries.get(key)
        return list(entry.pods.values()) if entry else []

    def replace(self, key: ServerKey, children: list[ChildView], pods: list[PodView]) -> None:
        """Everything known about one server, from a fresh list (a watch may miss deletions
        while the apiserver restarts)."""
        self._entries[key] = _Entry(
            children={c.ref: c for c in children}, pods={p.name: p for p in pods}
        )

    def forget(self, key: ServerKey) -> None:
        self._entries.pop(key, None)

    def servers(self) -> list[ServerKey]:
        return list(self._entries)
