"""The operator's Kubernetes calls: server-side apply, delete, status patches, discovery.

Built on the official `kubernetes` client's DynamicClient (its `request` is a stable public
entry point across client versions), run in a bounded thread pool so the asyncio loop that
kopf runs on never blocks. Paths come from a fixed table of the kinds the operator manages,
so no discovery round-trips are needed per call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, NotFoundError

from tpuserve_operator import labels

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "KINDS",
    "EventSink",
    "Kube",
    "KubeApi",
    "NotFoundError",
    "error_summary",
    "kind_of",
    "load_configuration",
]

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        where = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{where}/{self.plural}" + (f"/{name}" if name else "")


KINDS: dict[tuple[str, str], Kind] = {
    (k.api_version, k.kind): k
    for k in (
        Kind("v1", "Service", "services"),
        Kind("v1", "ConfigMap", "configmaps"),
        Kind("v1", "Secret", "secrets"),
        Kind("v1", "ServiceAccount", "serviceaccounts"),
        Kind("v1", "Pod", "pods"),
        Kind("apps/v1", "StatefulSet", "statefulsets"),
        Kind("apps/v1", "Deployment", "deployments"),
        Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
        Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
        Kind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects"),
        Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
        Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
        Kind("coordination.k8s.io/v1", "Lease", "leases"),
        Kind("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets"),
        Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
        Kind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
        Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
        Kind(labels.API_VERSION, labels.KIND, labels.PLURAL),
        Kind(labels.API_VERSION, labels.ROLE_KIND, labels.ROLE_PLURAL),
        Kind(labels.API_VERSION, labels.GATEWAY_KIND, labels.GATEWAY_PLURAL),
        Kind("kopf.dev/v1", "ClusterKopfPeering", "clusterkopfpeerings", namespaced=False),
        Kind("kopf.dev/v1", "KopfPeering", "kopfpeerings"),
    )
}


def kind_of(manifest: Mapping[str, Any]) -> Kind:
    key = (str(manifest["apiVersion"]), str(manifest["kind"]))
    try:
        return KINDS[key]
    except KeyError:
        raise ValueError(f"the operator does not manage {key[1]} ({key[0]})") from None


def error_summary(err: Exception) -> str:
    """A one-line, secret-free description of an API error, for conditions and logs."""
    if isinstance(err, DynamicApiError):
        return str(err.summary())  # type: ignore[no-untyped-call]
    return f"{type(err).__name__}: {err}"


def load_configuration(
    kubeconfig: str | None = None, pool_size: int = 16
) -> k8s_client.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    configuration = k8s_client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = pool_size
    return configuration


EventSink = Callable[[Mapping[str, Any], str, str, str], None]
"""Posts an Event about an object: (body, type, reason, message); kopf.event in the operator."""


class KubeApi(Protocol):
    """The calls the reconciler makes (`Kube`; unit tests use an in-memory fake)."""

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...

    async def create(self, manifest: Mapping[str, Any]) -> bool: ...

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *, uid: str | None = None
    ) -> bool: ...

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    async def patch_replicas(self, namespace: str, name: str, replicas: int) -> None: ...

    async def patch_role(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, status: bool = False
    ) -> None: ...

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]] | None: ...

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None: ...

    async def has_group_version(self, group_version: str, ttl_seconds: float = 30.0) -> bool: ...

    async def has_resource(
        self, group_version: str, plural: str, ttl_seconds: float = 30.0
    ) -> bool: ...


def replicas_patch(replicas: int) -> dict[str, Any]:
    """The merge patch that sets a TPUModelServer's spec.replicas and, in the same write,
    its `labels.SCALED_TO_ZERO` mark (removed above 0)."""
    mark = "true" if replicas == 0 else None
    return {
        "metadata": {"annotations": {labels.SCALED_TO_ZERO: mark}},
        "spec": {"replicas": replicas},
    }


class Kube:
    """Asynchronous facade over the synchronous official client."""

    def __init__(self, configuration: k8s_client.Configuration, workers: int = 16) -> None:
        self._api_client = k8s_client.ApiClient(configuration)
        self._dynamic = DynamicClient(self._api_client)  # type: ignore[no-untyped-call]
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kube")
        self._group_versions: dict[str, tuple[float, bool]] = {}
        self._resources: dict[str, tuple[float, frozenset[str]]] = {}

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _request(self, method: str, path: str, **params: Any) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            # serialize=False: the raw response; json is far cheaper than ResourceInstance.
            response = self._dynamic.request(method, path, serialize=False, **params)
            data = getattr(response, "data", b"")
            parsed = json.loads(data) if data else {}
            return parsed if isinstance(parsed, dict) else {}

        return await self._run(call)

    async def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with the operator's one field manager, taking ownership of
        every field it sets (so hand edits to those fields are reverted)."""
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        return await self._request(
            "patch",
            kind.path(meta.get("namespace"), meta["name"]),
            body=dict(manifest),
            content_type=APPLY_PATCH,
            field_manager=labels.FIELD_MANAGER,
            force_conflicts=True,
        )

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create ``manifest`` unless an object of its name exists (then False): what is
        made once and never read back (a Secret whose value the operator must not hold)."""
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        try:
            await self._request("post", kind.path(meta.get("namespace")), body=dict(manifest))
        except ConflictError:
            return False
        return True

    async def create_if_missing(self, manifest: Mapping[str, Any]) -> None:
        kind = kind_of(manifest)
        meta = manifest["metadata"]
        try:
            await self._request("get", kind.path(meta.get("namespace"), meta["name"]))
        except NotFoundError:
            await self._request("post", kind.path(meta.get("namespace")), body=dict(manifest))

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *, uid: str | None = None
    ) -> bool:
        """Delete in the background (dependents are collected by the garbage collector).
        With `uid`, only that incarnation is deleted (the apiserver answers 409 when the name
        now holds another one). False when it was already gone."""
        target = KINDS[(api_version, kind)]
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._request("delete", target.path(namespace, name), body=body)
        except NotFoundError:
            return False
        except ConflictError:
            if uid:
                return False  # that incarnation is gone; a new one has its name
            raise
        return True

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        kind = KINDS[(labels.API_VERSION, labels.KIND)]
        await self._request(
            "patch",
            kind.path(namespace, name) + "/status",
            body={"status": dict(status)},
            content_type=MERGE_PATCH,
        )

    async def patch_gateway_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        kind = KINDS[(labels.API_VERSION, labels.GATEWAY_KIND)]
        await self._request(
            "patch",
            kind.path(namespace, name) + "/status",
            body={"status": dict(status)},
            content_type=MERGE_PATCH,
        )

    async def patch_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """Set a TPUModelServer's spec.replicas (scale to zero and back), as `kubectl
        scale` would, marking it `labels.SCALED_TO_ZERO` at 0 (unmarked otherwise)."""
        kind = KINDS[(labels.API_VERSION, labels.KIND)]
        await self._request(
            "patch",
            kind.path(namespace, name),
            body=replicas_patch(replicas),
            content_type=MERGE_PATCH,
        )

    async def patch_role(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, status: bool = False
    ) -> None:
        """Merge-patch a TPUModelServerRole (its spec.replicas when it has none), or with
        ``status`` its status subresource (the role's groups and leaders' selector)."""
        kind = KINDS[(labels.API_VERSION, labels.ROLE_KIND)]
        await self._request(
            "patch",
            kind.path(namespace, name) + ("/status" if status else ""),
            body=dict(patch),
            content_type=MERGE_PATCH,
        )

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self._request("get", KINDS[(api_version, kind)].path(namespace, name))
        except NotFoundError:
            return None

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]] | None:
        """Objects of a kind in a namespace matching a label selector; None when the kind is
        not served (its CRD is not installed)."""
        try:
            listing = await self._request(
                "get", KINDS[(api_version, kind)].path(namespace), label_selector=selector
            )
        except NotFoundError:
            return None
        items = listing.get("items") or []
        for item in items:  # list items carry no apiVersion/kind of their own
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return list(items)

    async def has_group_version(self, group_version: str, ttl_seconds: float = 30.0) -> bool:
        """Whether the apiserver serves `group/version` (e.g. a CRD is installed); cached."""
        cached = self._group_versions.get(group_version)
        now = time.monotonic()
        if cached is not None and now - cached[0] < ttl_seconds:
            return cached[1]
        try:
            await self._request("get", f"/apis/{group_version}")
            served = True
        except NotFoundError:
            served = False
        self._group_versions[group_version] = (now, served)
        return served

    async def has_resource(
        self, group_version: str, plural: str, ttl_seconds: float = 30.0
    ) -> bool:
        """Whether the apiserver serves ``plural`` in `group/version` (its CRD is installed,
        not only another of the group's); cached."""
        cached = self._resources.get(group_version)
        now = time.monotonic()
        if cached is None or now - cached[0] >= ttl_seconds:
            try:
                listing = await self._request("get", f"/apis/{group_version}")
                names = frozenset(str(r.get("name")) for r in listing.get("resources") or [])
            except NotFoundError:
                names = frozenset()
            cached = self._resources[group_version] = (now, names)
        return plural in cached[1]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._api_client.close()  # type: ignore[no-untyped-call]
