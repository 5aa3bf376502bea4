"""Kubernetes discovery: watch the model-server pods matching a label selector.

A pod becomes a worker when it is a *ready leader*: not being deleted, phase Running,
condition Ready=True, and (unless ``leader_label`` is empty) carrying the leader label
(``serving.tpuserve.dev/role=leader`` by default, the operator's). Its URL is
``http://<pod IP>:<port>`` with the port taken, in order, from ``--worker-port``, the
container's ``TPUSERVE_HTTP_PORT`` variable, its container port named ``http``, or the
launch contract's default. The annotation ``serving.tpuserve.dev/worker-url`` overrides the
URL (tests use it so nothing ever dials a fake pod IP); ``.../kv-events-endpoint`` and
``.../kv-replay-endpoint`` override the KV-event endpoints, which are otherwise read from
the worker's ``/server_info`` (`tpuserve_router.kv.kv_publishers`). The pod label ``model``
(``--model-label``; the operator sets it to the server's ``servedName``) names the served
model the worker belongs to, so one router can front the leaders of several
TPUModelServers (a selector without the instance label; docs/router.md, "Many models").

A ready leader the router must not dial is *rejected*, not dropped silently: its annotation
URL is malformed, or its address or KV-event endpoint lies outside ``--worker-networks``.
The watcher keeps the current rejections (``GET /workers`` lists them with the reason) and
logs each once; one bad pod never stops the others from being routed.

The watch is a plain list-then-watch over the API server's HTTP interface (aiohttp,
cancellable), re-listing on ``410 Gone`` or a dropped connection; every change publishes
the full set of workers, which the app reconciles (workers join and leave live).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from sglang_tpu.disaggregation import (
    BOOTSTRAP_PORT_ANNOTATION,
    PD_CONTRACT_LABEL,
    PD_ROLE_LABEL,
    PD_ROLES,
)
from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.config import (
    DEFAULT_KV_EVENTS_ANNOTATION,
    DEFAULT_KV_REPLAY_ANNOTATION,
    DEFAULT_MODEL_LABEL,
    DEFAULT_WORKER_URL_ANNOTATION,
)
from tpuserve_router.engines.worker_networks import (
    DEFAULT_NETWORKS,
    Network,
    endpoint_problem,
    url_problem,
)
from tpuserve_router.engines.workers import WorkerSpec

log = logging.getLogger(__name__)

HTTP_PORT_ENV = "TPUSERVE_HTTP_PORT"
HTTP_PORT_NAME = "http"
RETRY_SECONDS = 2.0
WATCH_TIMEOUT_SECONDS = 300


def default_worker_port() -> int:
    """The engine's HTTP port when a pod says nothing else (from the launch contract)."""
    from sglang_tpu.contract.group_contract import GroupContract

    default = GroupContract.model_fields["http_port"].default
    return int(default)


@dataclass(frozen=True)
class PodRules:
    leader_label: tuple[str, str] | None
    worker_port: int | None = None
    url_annotation: str = DEFAULT_WORKER_URL_ANNOTATION
    kv_events_annotation: str = DEFAULT_KV_EVENTS_ANNOTATION
    kv_replay_annotation: str = DEFAULT_KV_REPLAY_ANNOTATION
    fallback_port: int = 30000
    networks: tuple[Network, ...] = ()  # empty: any address may be dialled
    model_label: str = DEFAULT_MODEL_LABEL  # empty: models are read from the workers

    @classmethod
    def from_flags(
        cls,
        leader_label: str,
        worker_port: int | None,
        url_annotation: str,
        networks: tuple[Network, ...] = (),
        model_label: str = DEFAULT_MODEL_LABEL,
    ) -> PodRules:
        label = None
        if leader_label:
            key, _, value = leader_label.partition("=")
            label = (key, value)
        return cls(
            label,
            worker_port,
            url_annotation,
            fallback_port=default_worker_port(),
            networks=networks,
            model_label=model_label,
        )


def is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def _pod_port(pod: Mapping[str, Any], rules: PodRules) -> int:
    if rules.worker_port is not None:
        return rules.worker_port
    containers = (pod.get("spec") or {}).get("containers") or ()
    for container in containers:
        for env in container.get("env") or ():
            if env.get("name") == HTTP_PORT_ENV and str(env.get("value", "")).isdigit():
                return int(env["value"])
    for container in containers:
        for port in container.get("ports") or ():
            if port.get("name") == HTTP_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return rules.fallback_port


def worker_from_pod(pod: Mapping[str, Any], rules: PodRules) -> WorkerSpec | None:
    """The worker a pod stands for, or None if it is not a ready leader."""
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return None
    labels = metadata.get("labels") or {}
    if rules.leader_label is not None:
        key, value = rules.leader_label
        if labels.get(key) != value:
            return None
    if not is_ready(pod):
        return None
    annotations = metadata.get("annotations") or {}
    url = annotations.get(rules.url_annotation)
    if not url:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{_pod_port(pod, rules)}"
    role = labels.get(PD_ROLE_LABEL)
    bootstrap: int | None = None
    with contextlib.suppress(TypeError, ValueError):
        bootstrap = int(annotations.get(BOOTSTRAP_PORT_ANNOTATION, ""))
    return WorkerSpec(
        url,
        kv_events_endpoint=annotations.get(rules.kv_events_annotation) or None,
        kv_replay_endpoint=annotations.get(rules.kv_replay_annotation) or None,
        model=(labels.get(rules.model_label) or None) if rules.model_label else None,
        role=role if role in PD_ROLES else None,  # a PD pair's worker (pipeline.selection)
        bootstrap_port=bootstrap if role == "prefill" else None,
        pd_contract=(labels.get(PD_CONTRACT_LABEL) or None) if role in PD_ROLES else None,
    )


@dataclass(frozen=True)
class RejectedPod:
    """A ready leader the router will not dial, and why."""

    pod: str
    url: str
    reason: str


def _dial_problem(spec: WorkerSpec, rules: PodRules, pod: Mapping[str, Any]) -> str | None:
    """Why the worker may not be dialled. Without ``--worker-networks``, what a pod's
    annotations name (its worker URL, its KV-event endpoints) must still be an IP in
    `DEFAULT_NETWORKS` (loopback and the private ranges pods have): anyone who may annotate
    a pod would otherwise have the router dial 169.254.169.254, the metadata server
    (issue 68), or a name resolving to it."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    annotated = rules.networks or DEFAULT_NETWORKS
    url_networks = annotated if annotations.get(rules.url_annotation) else rules.networks
    problem = url_problem(spec.url, url_networks)
    for endpoint in (spec.kv_events_endpoint, spec.kv_replay_endpoint):
        if problem is None and endpoint:
            problem = endpoint_problem(endpoint, annotated)
    if problem is not None and not rules.networks:
        problem += " (annotations are dialled only inside these without --worker-networks)"
    return problem


def classify_pods(
    pods: Iterable[Mapping[str, Any]], rules: PodRules
) -> tuple[list[WorkerSpec], list[RejectedPod]]:
    """Ready leaders as workers, and those that may not be dialled as rejections; both
    ordered by pod name so the order is stable."""
    ordered = sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", ""))
    specs: list[WorkerSpec] = []
    rejected: list[RejectedPod] = []
    for pod in ordered:
        spec = worker_from_pod(pod, rules)
        if spec is None:
            continue
        problem = _dial_problem(spec, rules, pod)
        if problem is None:
            specs.append(spec)
        else:
            name = str((pod.get("metadata") or {}).get("name", ""))
            rejected.append(RejectedPod(name, spec.url, problem))
    return specs, rejected


def workers_from_pods(pods: Iterable[Mapping[str, Any]], rules: PodRules) -> list[WorkerSpec]:
    """Ready leaders as workers (rejected ones left out), ordered by pod name."""
    return classify_pods(pods, rules)[0]


class PodSet:
    """The pods a list+watch has seen, keyed by uid; ``apply`` takes one watch event."""

    def __init__(self) -> None:
        self.pods: dict[str, Mapping[str, Any]] = {}

    def reset(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self.pods = {self._key(p): p for p in pods}

    def apply(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """Apply an ADDED/MODIFIED/DELETED event; True if the set changed."""
        key = self._key(pod)
        if kind in ("ADDED", "MODIFIED"):
            self.pods[key] = pod
            return True
        if kind == "DELETED":
            return self.pods.pop(key, None) is not None
        return False

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        metadata = pod.get("metadata") or {}
        return str(metadata.get("uid") or metadata.get("name"))


@dataclass(frozen=True)
class ApiServer:
    """Where and how to reach the Kubernetes API (from kubeconfig or the pod's account).

    ``bearer_token`` gives the current ``Authorization`` value, asked again for every list
    and watch: the kubernetes client re-reads a pod's projected token, which the kubelet
    rotates, and refreshes expiring kubeconfig credentials.
    """

    host: str
    headers: dict[str, str]
    ssl_context: ssl.SSLContext | bool
    bearer_token: Callable[[], str | None] | None = None

    def request_headers(self) -> dict[str, str]:
        token = self.bearer_token() if self.bearer_token is not None else None
        return {**self.headers, "Authorization": token} if token else dict(self.headers)

    @classmethod
    def load(cls) -> ApiServer:
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            # KUBECONFIG is read now: the client reads it once, when it is first imported.
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )

        def bearer_token() -> str | None:
            # The loaders store the token as api_key["BearerToken"] ("Bearer <token>");
            # auth_settings() reads it through the refresh hook, under any client version.
            setting = configuration.auth_settings().get("BearerToken")
            value = setting.get("value") if setting else None
            return str(value) if value else None

        context: ssl.SSLContext | bool = False
        if configuration.host.startswith("https"):
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        return cls(configuration.host.rstrip("/"), {}, context, bearer_token)


class ApiTask:
    """One background task talking to the API server, owned by its ``start`` and ``stop``
    (the pod watch; the router's demand Lease, `tpuserve_router.tenancy.demand`)."""

    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        self._task = None

    async def _run(self) -> None:
        raise NotImplementedError


class PodWatcher(ApiTask):
    """List+watch pods matching ``selector`` in ``namespace``; report workers on change."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        selector: Mapping[str, str],
        rules: PodRules,
        publish: Callable[[list[WorkerSpec]], None],
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.selector = ",".join(f"{k}={v}" for k, v in selector.items())
        self.rules = rules
        self.publish = publish
        self.pods = PodSet()
        self.rejected: list[RejectedPod] = []

    def _url(self, **params: str) -> str:
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
        return f"{self.api.host}/api/v1/namespaces/{quote(self.namespace)}/pods?{query}"

    def _report(self) -> None:
        specs, rejected = classify_pods(self.pods.pods.values(), self.rules)
        for pod in set(rejected) - set(self.rejected):
            log.warning("pod %s/%s is not routed: %s", self.namespace, pod.pod, pod.reason)
        self.rejected = rejected
        self.publish(specs)

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    version = await self._list(session)
                    await self._watch(session, version)
                except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                    log.warning("pod watch in %s failed (%s); retrying", self.namespace, err)
                    await asyncio.sleep(RETRY_SECONDS)

    async def _list(self, session: aiohttp.ClientSession) -> str:
        async with session.get(
            self._url(labelSelector=self.selector),
            headers=self.api.request_headers(),
            ssl=self.api.ssl_context,
        ) as response:
            response.raise_for_status()
            body = orjson.loads(await response.read())
        self.pods.reset(body.get("items") or ())
        self._report()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self, session: aiohttp.ClientSession, version: str) -> None:
        url = self._url(
            labelSelector=self.selector,
            watch="1",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_TIMEOUT_SECONDS),
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_SECONDS + 30)
        async with session.get(
            url, headers=self.api.request_headers(), ssl=self.api.ssl_context, timeout=timeout
        ) as response:
            response.raise_for_status()
            async for line in response.content:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    log.info("pod watch expired (%s); listing again", obj.get("message"))
                    return
                if kind in ("ADDED", "MODIFIED", "DELETED") and self.pods.apply(kind, obj):
                    self._report()
