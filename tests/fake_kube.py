"""Test fakes of the Kubernetes side: `FakeKube`, an in-memory apiserver behind the operator's
`KubeApi` protocol; the operator's `PodView` and a pod as the apiserver has it; TPUModelServers
as admission sees them. The router's, the pod runner's and the launcher's fakes are in
`tests/fakes.py`."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError, UnprocessibleEntityError

from tpuserve_operator import labels
from tpuserve_operator.kube import replicas_patch
from tpuserve_operator.observed import PodView

# --- operator / kube ---------------------------------------------------------------------------
#
# `FakeKube` is an in-memory apiserver behind the operator's `KubeApi` protocol: server-side
# apply stores the object and bumps its generation and resourceVersion, deletes remove it, and
# every change is delivered to the watchers (as kopf's watches would deliver it to the
# reconciler). It runs no controllers: pods exist only when a test puts them.
# `make_pod` builds the operator's compact `PodView`; `pod_object` a pod as the apiserver has it.

Watcher = Callable[[str, Mapping[str, Any]], None]  # event type (ADDED, MODIFIED, DELETED), body
ObjectKey = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


def not_found(what: str) -> NotFoundError:
    # the client's exceptions are untyped
    return NotFoundError(ApiException(status=404, reason=f"{what} not found"))  # type: ignore[no-untyped-call]


def refused(reason: str) -> UnprocessibleEntityError:
    return UnprocessibleEntityError(ApiException(status=422, reason=reason))  # type: ignore[no-untyped-call]


def _merge_patch(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch, as the apiserver applies `application/merge-patch+json`."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            current = out.get(key)
            out[key] = _merge_patch(current if isinstance(current, dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class FakeKube:
    """An in-memory apiserver for the operator (see the section comment above)."""

    def __init__(self, group_versions: Iterable[str] = ()) -> None:
        self.objects: dict[ObjectKey, dict[str, Any]] = {}
        self.group_versions = set(group_versions)
        # the chart's CRDs (TPUModelServerRole too); a test removes one to see it missing
        self.resources = {
            (labels.API_VERSION, labels.PLURAL),
            (labels.API_VERSION, labels.ROLE_PLURAL),
        }
        self.applied: list[tuple[str, str]] = []  # (kind, name) of every accepted apply
        self.deleted: list[tuple[str, str]] = []  # (kind, name) of every delete that found one
        self.status_patches: list[dict[str, Any]] = []
        self.replica_patches: list[int] = []  # spec.replicas set by the operator, in order
        self.refuse_kinds: dict[str, Exception] = {}  # kind -> what an apply of it raises
        self.status_error: Exception | None = None  # what patch_status raises, if anything
        self._watchers: list[Watcher] = []
        self._versions = itertools.count(1)
        self._uids = itertools.count(1)

    # -- what tests use -----------------------------------------------------------------------

    def watch(self, watcher: Watcher) -> None:
        self._watchers.append(watcher)

    def put(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object as another client would (pods, the server itself)."""
        stored = copy.deepcopy(dict(body))
        meta = stored.setdefault("metadata", {})
        existed = self._key(stored) in self.objects
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[self._key(stored)] = stored
        self._notify("MODIFIED" if existed else "ADDED", stored)
        return copy.deepcopy(stored)

    def get_object(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return self.objects[(api_version, kind, namespace, name)]

    def names(self, kind: str) -> list[str]:
        return sorted(key[3] for key in self.objects if key[1] == kind)

    # -- the KubeApi protocol ------------------------------------------------------------------

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(manifest["kind"])
        if kind in self.refuse_kinds:
            raise self.refuse_kinds[kind]
        key = self._key(manifest)
        old = self.objects.get(key)
        new = copy.deepcopy(dict(manifest))
        meta = new["metadata"]
        if old is None:
            meta["uid"] = f"uid-{next(self._uids)}"
            meta["generation"] = 1
        else:
            meta["uid"] = old["metadata"]["uid"]
            if kind == labels.ROLE_KIND and "replicas" in (old.get("spec") or {}):
                # another manager's field (an HPA's): server-side apply leaves it
                new["spec"].setdefault("replicas", old["spec"]["replicas"])
            changed = old.get("spec") != new.get("spec")
            meta["generation"] = old["metadata"]["generation"] + (1 if changed else 0)
            if "status" in old:
                new["status"] = old["status"]
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[key] = new
        self.applied.append((kind, str(meta["name"])))
        self._notify("MODIFIED" if old else "ADDED", new)
        return copy.deepcopy(new)

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        if self._key(manifest) in self.objects:
            return False
        await self.apply(manifest)
        return True

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *, uid: str | None = None
    ) -> bool:
        body = self.objects.get((api_version, kind, namespace, name))
        if body is None or (uid and body["metadata"].get("uid") != uid):
            return False
        del self.objects[(api_version, kind, namespace, name)]
        self.deleted.append((kind, name))
        self._notify("DELETED", body)
        return True

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        if self.status_error is not None:
            raise self.status_error
        key = (labels.API_VERSION, labels.KIND, namespace, name)
        body = self.objects.get(key)
        if body is None:
            raise not_found(f"{labels.KIND} {namespace}/{name}")
        body["status"] = _merge_patch(body.get("status") or {}, status)
        self.status_patches.append(copy.deepcopy(dict(status)))

    async def patch_gateway_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        key = (labels.API_VERSION, labels.GATEWAY_KIND, namespace, name)
        body = self.objects.get(key)
        if body is None:
            raise not_found(f"{labels.GATEWAY_KIND} {namespace}/{name}")
        body["status"] = _merge_patch(body.get("status") or {}, status)

    async def patch_replicas(self, namespace: str, name: str, replicas: int) -> None:
        key = (labels.API_VERSION, labels.KIND, namespace, name)
        body = self.objects[key] = _merge_patch(self.objects[key], replicas_patch(replicas))
        body["metadata"]["generation"] = body["metadata"].get("generation", 1) + 1
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self.replica_patches.append(replicas)
        self._notify("MODIFIED", body)

    async def patch_role(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, status: bool = False
    ) -> None:
        key = (labels.API_VERSION, labels.ROLE_KIND, namespace, name)
        body = self.objects.get(key)
        if body is None:
            raise not_found(f"{labels.ROLE_KIND} {namespace}/{name}")
        if status:
            body["status"] = _merge_patch(body.get("status") or {}, patch.get("status") or {})
        else:
            self.objects[key] = body = _merge_patch(body, patch)
            body["metadata"]["generation"] = body["metadata"].get("generation", 1) + 1
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self._notify("MODIFIED", body)

    def scale(self, api_version: str, kind: str, namespace: str, name: str, replicas: int) -> None:
        """Set spec.replicas through the scale subresource, as an HPA or `kubectl scale`."""
        body = self.objects[(api_version, kind, namespace, name)]
        body["spec"]["replicas"] = replicas
        body["metadata"]["generation"] = body["metadata"].get("generation", 1) + 1
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self._notify("MODIFIED", body)

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]] | None:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        return [
            copy.deepcopy(body)
            for (v, k, ns, _), body in self.objects.items()
            if (v, k, ns) == (api_version, kind, namespace)
            and wanted.items() <= (body["metadata"].get("labels") or {}).items()
        ]

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        body = self.objects.get((api_version, kind, str(namespace), name))
        return copy.deepcopy(body) if body is not None else None

    async def has_group_version(self, group_version: str, ttl_seconds: float = 30.0) -> bool:
        return group_version in self.group_versions

    async def has_resource(
        self, group_version: str, plural: str, ttl_seconds: float = 30.0
    ) -> bool:
        return (group_version, plural) in self.resources

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _key(body: Mapping[str, Any]) -> ObjectKey:
        meta = body["metadata"]
        return (str(body["apiVersion"]), str(body["kind"]), str(meta["namespace"]), meta["name"])

    def _notify(self, event_type: str, body: Mapping[str, Any]) -> None:
        for watcher in self._watchers:
            watcher(event_type, copy.deepcopy(dict(body)))


RUNNING_POD = PodView(
    name="",
    replica=0,
    role="worker",
    revision="rev1",
    phase="Running",
    ready=True,
    running=True,
    deleting=False,
    unschedulable=None,
    crash_loop=None,
    restarts=0,
    created="",
)


def make_pod(name: str, *, running: bool = True, **changes: Any) -> PodView:
    """A running, ready pod of group 0 named ``name``; ``running=False`` makes it Pending."""
    if not running:
        changes |= {"phase": "Pending", "running": False, "ready": False}
    return dataclasses.replace(RUNNING_POD, name=name, **changes)


def pod_object(
    server: str,
    name: str,
    *,
    namespace: str = "ml",
    replica: int = 0,
    role: str = labels.ROLE_LEADER,
    revision: str = "",
    ready: bool = True,
    unschedulable: str | None = None,
    restarts: int = 0,
    ip: str | None = None,
    extra_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An engine pod of `server`'s replica group `replica` as the apiserver shows it:
    running (and ready, at `ip` when given), or Pending with the scheduler's `unschedulable`
    message. `extra_labels`: e.g. a disaggregated server's role and pairing contract."""
    pod_labels = {
        **labels.common(server, labels.COMPONENT_MODEL_SERVER),
        labels.REPLICA: str(replica),
        labels.ROLE: role,
        labels.REVISION: revision,
        **(extra_labels or {}),
    }
    if unschedulable is not None:
        status: dict[str, Any] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": unschedulable,
                }
            ],
        }
    else:
        status = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "engine", "restartCount": restarts, "state": {}}],
        }
        if ip is not None:
            status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels},
        "status": status,
    }


# --- admission: TPUModelServers as admission sees them ---------------------------------------


def tms_object(
    source: str = "hf://Qwen/Qwen3-8B",
    generation: str = "v6e",
    topology: str = "2x4",
    *,
    name: str = "m",
    quantization: str = "none",
    kv_cache_dtype: str = "auto",
    engine_type: str = "sglang",
    context_length: int | None = None,
    engine: Mapping[str, Any] | None = None,
    template: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A TPUModelServer with the CRD's defaults filled in, as admission policies receive it."""
    model: dict[str, Any] = {"source": source, "quantization": quantization}
    if context_length is not None:
        model["contextLength"] = context_length
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": model,
            "tpu": {"generation": generation, "topology": topology},
            "replicas": 1,
            "engine": {
                "type": engine_type,
                "executionMode": "compiled",
                "kvCacheDtype": kv_cache_dtype,
                **(engine or {}),
            },
            "template": dict(template or {}),
        },
    }


def operator_verdict(obj: Mapping[str, Any]) -> str | None:
    """What the operator's validation says about `obj` (its `Valid` message), None if valid."""
    from tpuserve_operator import validation
    from tpuserve_operator.errors import InvalidSpec

    try:
        validation.validate(obj["metadata"]["name"], obj["spec"], cel_rules=False)
    except InvalidSpec as err:
        return str(err)
    return None
