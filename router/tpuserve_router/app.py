"""The router application: its parts wired together, their lifetimes, and request dispatch.

`RouterApp(config)` owns everything that runs: the HTTP front (`server`), the generation
routes (`forwarding`, with `retry`'s rule), the admin API (`admin`), worker admission with
its health checks and per-worker connection pools (`admission`), discovery (static or
Kubernetes), KV-event subscriptions (`kv_events`, for a policy with a block index unless
``--no-kv-events``), peering with the other router replicas (`peers`, with ``--peer-port``;
`peer_snapshot`: a replica started late takes a peer's block index) and the metrics.
``await app.start()`` listens and starts the background tasks; ``await app.stop()`` cancels
and awaits every one of them.

Routes (the router speaks SGLang's API, so it fronts real SGLang, the engine twin or any
SGLang-compatible server):

- ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /generate``: routed by
  the policy and proxied; streams pass through chunk by chunk (`forwarding`);
- ``GET /v1/models``: the models the workers serve, and their loaded LoRA adapters;
  ``GET /v1/models/{id}``: one of them (404 ``model_not_found`` otherwise);
- (the engine load poll, `engine_loads`, feeds every worker's load view, so several
  router replicas see each other's requests)
- ``GET /health`` (the router is up), ``GET /readiness`` (at least one routable worker,
  or holding is on: ``--hold-max-requests`` above 0),
  ``GET /metrics``;
- admin: ``GET /workers``, ``POST /workers`` (``{"url": ...}``), ``DELETE /workers``
  (``{"url": ...}`` or ``?url=``), ``POST /flush_cache`` (sent to every worker) (`admin`),
  ``GET /kv_snapshot`` (the block index, for a replica started late: `kv_events`).

An unknown path gets 404, a known path with another method 405 naming the allowed ones,
a method the router never serves (``CONNECT``, ``PUT``, ...) 405. With ``--metrics-port``,
that port serves ``/metrics``, ``/health`` and ``/readiness`` with a connection budget of
its own (`PROBE_CONNECTIONS`), so probes and scrapes are never locked out by clients.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

import aiohttp
import msgpack
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.version import tpuserve_version
from tpuserve_router.admin import ROUTE as ADMIN_ROUTE
from tpuserve_router.admin import AdminApi
from tpuserve_router.admission import Admission
from tpuserve_router.auth import ApiKey, KeyStore, presented_key
from tpuserve_router.block_index import BlockIndex
from tpuserve_router.cancellation import Aborter
from tpuserve_router.config import RouterConfig, kv_events_enabled
from tpuserve_router.connections import ConnectionBook
from tpuserve_router.core import RouterCore
from tpuserve_router.discovery.static import static_workers
from tpuserve_router.engine_loads import LoadPoller
from tpuserve_router.forwarding import Forwarder
from tpuserve_router.health import HealthChecker
from tpuserve_router.hold import touch_hold_series
from tpuserve_router.kv_events import KvEventHub
from tpuserve_router.metrics import (
    RouterMetrics,
    StateCollector,
    WorkerState,
    create_router_metrics,
    touch_known_series,
)
from tpuserve_router.outliers import Ejectable, OutlierDetector
from tpuserve_router.peer_snapshot import (
    SnapshotService,
    snapshot_endpoint,
    snapshot_port,
    unpack_snapshot,
)
from tpuserve_router.peer_view import PeerView, new_router_id
from tpuserve_router.peers import PeerNetwork
from tpuserve_router.policies.base import Policy, make_policy
from tpuserve_router.replies import model_not_found, reject, unauthorized
from tpuserve_router.request_body import GENERATION_ROUTES, ClientError
from tpuserve_router.server import (
    JSON_HEADERS,
    RETRY_AFTER,
    FrontLimits,
    Handler,
    HttpRequest,
    serve,
)
from tpuserve_router.token_cache import ChatTokenCache
from tpuserve_router.worker_networks import parse_networks
from tpuserve_router.workers import WorkerRegistry, WorkerSpec, normalize_worker_url

if TYPE_CHECKING:
    from tpuserve_router.demand import DemandLease
    from tpuserve_router.discovery.kubernetes import PodWatcher, RejectedPod

log = logging.getLogger(__name__)

METRICS_HEADERS: Final = f"content-type: {CONTENT_TYPE_LATEST}\r\n".encode()
MSGPACK_HEADERS: Final = b"content-type: application/msgpack\r\n"
KNOWN_METHODS: Final = (b"GET", b"HEAD", b"POST", b"DELETE")
MODELS_PREFIX: Final = "/v1/models/"
PROBE_CONNECTIONS: Final = 64
"""The metrics port's own connection budget: probes and scrapes never wait for clients."""
PROBE_BODY_BYTES: Final = 1 << 16
FD_RESERVE: Final = 512
"""Open files kept for what is not a client connection (listeners, health checks, idle
upstream pools, KV-event sockets, logs), beside one upstream connection per request."""


class RouterApp:
    def __init__(
        self,
        config: RouterConfig,
        *,
        registry: CollectorRegistry | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.config = config.validate()
        params: dict[str, Any] = dict(config.policy_params)
        self.policy = policy or make_policy(config.policy, seed=config.seed, **params)
        self.tokenizer: ChatTokenCache | None = (
            ChatTokenCache(load_tokenizer(config.tokenizer)) if self.policy.needs_tokens else None
        )
        self.networks = parse_networks(config.worker_networks)
        self.metrics: RouterMetrics = create_router_metrics(registry or CollectorRegistry())
        self.metrics.info.labels(self.policy.name, tpuserve_version()).set(1)
        touch_known_series(self.metrics, self.policy.name)
        self.registry = WorkerRegistry()
        self.outliers = OutlierDetector(
            config.outlier_config(), lambda: self.registry.workers, self._ejected
        )
        self.block_index: BlockIndex | None = self.policy.block_index
        self.kv: KvEventHub | None = None
        if kv_events_enabled(config.kv_events, self.policy):
            if self.block_index is None:
                log.warning(
                    "--kv-events has no effect with policy %s (it keeps no block index); "
                    "use precise or cost",
                    self.policy.name,
                )
            else:
                self.kv = KvEventHub(self.block_index, self.metrics)
        self.peering: PeerNetwork | None = None
        self.snapshots: SnapshotService | None = None
        if config.peer_port:
            view = PeerView(
                new_router_id(), self.policy, self.registry.get, clock=time.monotonic,
                max_open_per_peer=config.max_in_flight,
                open_ttl_seconds=config.request_timeout_seconds,
            )  # fmt: skip
            self.peering = PeerNetwork(
                view, self.metrics, host=config.host, port=config.peer_port, peers=config.peers,
                dns_name=config.peers_from_dns,
                refresh_seconds=config.peers_refresh_interval_seconds,
            )  # fmt: skip
            self.snapshots = SnapshotService(
                self._snapshot_to_give, host=config.host, port=snapshot_port(config.peer_port),
                timeout_seconds=config.kv_snapshot_timeout_seconds,
                max_bytes=config.kv_snapshot_max_bytes,
            )  # fmt: skip
        core = RouterCore(
            self.config, self.policy, self.registry, self.metrics,
            self.peering.link if self.peering is not None else None,
        )  # fmt: skip
        self.admission = Admission(core, self.networks, self.kv)
        self.health: HealthChecker = self.admission.health
        self.loads: LoadPoller | None = None
        if config.load_poll_interval_seconds > 0:
            self.loads = LoadPoller(
                self.registry,
                self.policy.queued_prefill_tokens,
                interval_seconds=config.load_poll_interval_seconds,
                timeout_seconds=config.health_check_timeout_seconds,
            )
        self.keys: KeyStore | None = None
        if config.api_keys_file is not None:
            self.keys = KeyStore(
                config.api_keys_file, config.api_keys_reload_seconds, self._keys_reloaded
            )
            self.metrics.api_keys.labels().set(len(self.keys.keys))
        self.aborter = Aborter(
            lambda: self.health.session,
            lambda worker, reason: self.metrics.upstream_aborts.labels(worker, reason).inc(),
        )
        self.forwarder = Forwarder(
            core,
            self.tokenizer,
            self.outliers,
            self.aborter,
            self.keys,
        )
        if self.kv is not None:  # decisions see the events at most an interval late
            self.forwarder.before_decision = self.kv.readers.read_if_due
        holds = self.forwarder.holds
        self.registry.on_changed.append(lambda _registry: holds.announce())
        self.admission.on_routable = holds.announce
        if holds.enabled:
            for model in config.hold_models:
                touch_hold_series(self.metrics, model)
        self._demand: DemandLease | None = None
        self.admin = AdminApi(
            self.registry, self.policy, self.health, self.metrics, self.networks, self._rejected
        )
        self.metrics.registry.register(
            StateCollector(
                self._worker_states, self.policy.index_sizes, lambda: len(self.book.open)
            )
        )
        admin = self._admin_only
        self._post: dict[str, Handler] = {
            "/workers": admin(self.admin.add_worker),
            "/flush_cache": admin(self.admin.flush_cache),
            "/add_worker": admin(self.admin.add_worker),
            "/remove_worker": admin(self.admin.remove_worker),
        }
        for route, parser in GENERATION_ROUTES.items():
            self._post[route] = self.forwarder.handler(route, parser)
        self._model_card = self._model if self.keys is None else self._keyed(self._model)
        self._get: dict[str, Handler] = {
            "/v1/models": self._models if self.keys is None else self._keyed(self._models),
            "/health": self._health,
            "/readiness": self._readiness,
            "/metrics": self._metrics,
            "/workers": admin(self.admin.list_workers),
            "/kv_snapshot": admin(self._kv_snapshot),
        }
        self._delete: dict[str, Handler] = {
            "/workers": admin(self.admin.remove_worker),
        }
        self.limits: FrontLimits = config.front_limits(connection_budget(config))
        self.book = ConnectionBook(
            self.limits.max_connections, self.limits.tick_seconds, self._connection_closed
        )
        self.probe_book = ConnectionBook(
            PROBE_CONNECTIONS, self.limits.tick_seconds, self._connection_closed
        )
        self._servers: list[asyncio.Server] = []
        self._discovery: PodWatcher | None = None

    # ================================================================== lifetime

    @property
    def port(self) -> int:
        """The port the front listens on (useful with port 0)."""
        return int(self._servers[0].sockets[0].getsockname()[1])

    @property
    def metrics_port(self) -> int | None:
        if len(self._servers) < 2:
            return None
        return int(self._servers[1].sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def start(self) -> None:
        config = self.config
        if self.peering is not None:  # first: a port it cannot bind stops the start cleanly
            await self.peering.start()  # peers from --peers-from-dns resolved (bounded) too
        if self.snapshots is not None:
            await self.snapshots.start()
        if self.limits.max_connections < config.max_connections:
            log.warning(
                "max_connections lowered from %d to %d: the process may open %d files "
                "(RLIMIT_NOFILE), and %d are kept for requests to workers and the rest",
                config.max_connections,
                self.limits.max_connections,
                open_file_limit(),
                config.max_in_flight + FD_RESERVE,
            )
        front = await serve(self._handle, config.host, config.port, self.limits, self.book)
        self._servers.append(front)
        if config.metrics_port is not None:
            probe_limits = dataclasses.replace(
                self.limits, max_connections=PROBE_CONNECTIONS, max_body_bytes=PROBE_BODY_BYTES
            )
            self._servers.append(
                await serve(
                    self._handle_probe,
                    config.host,
                    config.metrics_port,
                    probe_limits,
                    self.probe_book,
                )
            )
        self.admission.start()
        if self.loads is not None:
            self.loads.start()
        if self.kv is not None:  # before any worker is subscribed
            await self._seed_from_peer()
        self.outliers.start()
        if self.keys is not None:
            self.keys.start()
        if config.discovery == "kubernetes":
            from tpuserve_router.discovery.kubernetes import ApiServer, PodRules, PodWatcher

            rules = PodRules.from_flags(
                config.leader_label,
                config.worker_port,
                config.worker_url_annotation,
                self.networks,
                config.model_label,
            )
            namespace = config.namespace or _current_namespace()
            api = ApiServer.load()
            self._discovery = PodWatcher(
                api, namespace, config.selector, rules, self.apply_discovered
            )
            self._discovery.start()
            if config.demand_lease is not None:
                from tpuserve_router.demand import DemandLease

                forwarder = self.forwarder
                self._demand = DemandLease(
                    api,
                    namespace,
                    config.demand_lease,
                    config.demand_interval_seconds,
                    self.metrics,
                    lambda: forwarder.in_flight > 0 or forwarder.holds.total > 0,
                )
                forwarder.on_arrival = self._demand.arrived
                self._demand.start()
        else:
            self.apply_discovered(static_workers(config.workers))
        log.info(
            "router listening on %s (policy %s, KV events %s, %d workers)",
            self.base_url,
            self.policy.name,
            "on" if self.kv is not None else "off",
            len(self.registry.workers),
        )

    async def stop(self) -> None:
        """Stop: no new connections (readiness fails), held requests refused with 503 and
        Retry-After, requests and streams in hand given up to ``drain_seconds`` to finish."""
        self.forwarder.holds.refuse_all("the router is stopping; retry")
        if self._demand is not None:
            await self._demand.stop()
            self._demand = None
        if self._discovery is not None:
            await self._discovery.stop()
            self._discovery = None
        for server in self._servers:
            server.close()
        deadline = time.monotonic() + self.config.drain_seconds
        while len(self.book.open) > len(self.book.waiting):  # requests still in hand
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for book in (self.book, self.probe_book):
            book.stop()
            for conn in list(book.open):
                conn.evict()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        self.outliers.stop()
        if self.keys is not None:
            self.keys.stop()
        await self.aborter.stop()
        await self.admission.stop()
        if self.loads is not None:
            await self.loads.stop()
        if self.snapshots is not None:
            await self.snapshots.stop()
        if self.peering is not None:
            await self.peering.stop()
        if self.kv is not None:
            await self.kv.stop()

    def apply_discovered(self, specs: list[WorkerSpec]) -> None:
        """Make the discovered workers exactly ``specs`` (admin-added ones stay)."""
        added, removed = self.registry.sync(specs)
        if added or removed:
            log.info("workers added: %s; removed: %s", added or "none", removed or "none")

    def _rejected(self) -> list[RejectedPod]:
        return self._discovery.rejected if self._discovery is not None else []

    # ================================================================== dispatch

    async def _handle(self, request: HttpRequest) -> None:
        method = request.method
        if method == b"POST":
            handler = self._post.get(request.path)
        elif method == b"GET" or method == b"HEAD":
            handler = self._get.get(request.path)
        elif method == b"DELETE":
            handler = self._delete.get(request.path)
        else:
            handler = None
        if handler is not None:
            await handler(request)
            return
        path = request.path
        if (method == b"GET" or method == b"HEAD") and path.startswith(MODELS_PREFIX):
            await self._model_card(request)
            return
        if path in self._post or path in self._get or path in self._delete:
            allowed = [
                m
                for m, t in (("GET", self._get), ("POST", self._post), ("DELETE", self._delete))
                if path in t
            ]
            reject(
                request,
                ClientError(
                    405,
                    f"method {method.decode('latin-1')} is not allowed on {path}; "
                    f"allowed: {', '.join(allowed)}",
                    param="method",
                    headers={"allow": ", ".join(allowed)},
                ),
                self.metrics,
                route="other",
            )
            return
        if method not in KNOWN_METHODS:  # CONNECT included: the router is no forward proxy
            reject(
                request,
                ClientError(
                    405,
                    f"method {method.decode('latin-1')} is not supported; supported: "
                    f"{', '.join(m.decode() for m in KNOWN_METHODS)}",
                    param="method",
                    headers={"allow": ", ".join(m.decode() for m in KNOWN_METHODS)},
                ),
                self.metrics,
                route="other",
            )
            return
        reject(
            request,
            ClientError(404, f"no route {path}", param="path", error_type="not_found_error"),
            self.metrics,
            route="other",
        )

    async def _handle_probe(self, request: HttpRequest) -> None:
        """The metrics port: scrapes and probes, with a connection budget of their own."""
        path = request.path
        if path == "/metrics":
            await self._metrics(request)
        elif path == "/health":
            await self._health(request)
        elif path == "/readiness":
            await self._readiness(request)
        else:
            request.respond(
                404,
                JSON_HEADERS,
                b'{"error": "only /metrics, /health and /readiness are served here"}',
            )

    # ================================================================== who may do what

    def _admin_only(self, handler: Handler) -> Handler:
        """``handler``, answering only those ``--admin`` lets use the admin API."""

        async def gated(request: HttpRequest) -> None:
            refusal = self._admin_refusal(request)
            if refusal is None:
                await handler(request)
                return
            self.metrics.auth_failures.labels("admin_denied").inc()
            reject(request, refusal, self.metrics, route=ADMIN_ROUTE)

        return gated

    def _admin_refusal(self, request: HttpRequest) -> ClientError | None:
        mode = self.config.admin
        if mode == "open":
            return None
        if mode == "off":
            return ClientError(
                403, "the admin API is off (--admin off)", error_type="permission_error"
            )
        key = self._key_of(request)
        if key is not None and key.admin:
            return None
        if mode == "loopback" and request.from_loopback:
            return None
        allowed = "an admin API key" + (
            " or a client on the router's host" if mode == "loopback" else ""
        )
        return ClientError(
            403,
            f"the admin API needs {allowed} (--admin {mode})",
            error_type="permission_error",
        )

    def _keyed(self, handler: Handler) -> Handler:
        """``handler``, answering only requests with a valid API key (else 401)."""

        async def keyed(request: HttpRequest) -> None:
            presented = self._presented(request)
            if self.keys is not None and self.keys.authenticate(presented) is None:
                self.metrics.auth_failures.labels("missing" if not presented else "invalid").inc()
                reject(request, unauthorized(presented), self.metrics, route="other")
                return
            await handler(request)

        return keyed

    def _key_of(self, request: HttpRequest) -> ApiKey | None:
        return self.keys.authenticate(self._presented(request)) if self.keys is not None else None

    @staticmethod
    def _presented(request: HttpRequest) -> bytes | None:
        return presented_key(request.header(b"authorization"), request.header(b"x-api-key"))

    def _keys_reloaded(self, result: str, count: int) -> None:
        self.metrics.api_key_reloads.labels(result).inc()
        self.metrics.api_keys.labels().set(count)
        if result == "ok" and self.keys is not None:
            self.forwarder.quotas.keep_only(self.keys.keys)

    def _ejected(self, worker: Ejectable, reason: str) -> None:
        self.metrics.worker_ejections.labels(worker.name, reason).inc()
        log.warning(
            "worker %s ejected (%s) for %.0f s: %d consecutive failures, %d of %d requests "
            "failed this interval",
            worker.name,
            reason,
            worker.ejected_until - self.outliers.clock(),
            worker.consecutive_failures,
            worker.window_failures,
            worker.window_requests,
        )

    def _connection_closed(self, reason: str) -> None:
        self.metrics.connections_closed.labels(reason).inc()

    # ================================================================== the router's own state

    async def _health(self, request: HttpRequest) -> None:
        request.respond(200, JSON_HEADERS, b'{"status":"ok"}')

    async def _readiness(self, request: HttpRequest) -> None:
        """Ready with a routable worker, or while requests can be held for one (scale from
        zero: the router must take requests at zero replicas to signal demand)."""
        healthy = self.registry.healthy_count()
        holding = self.forwarder.holds.enabled
        body = orjson.dumps(
            {
                "ready": healthy > 0 or holding,
                "healthy_workers": healthy,
                "workers": len(self.registry.workers),
                "holding": holding,
            }
        )
        if healthy or holding:
            request.respond(200, JSON_HEADERS, body)
        else:
            request.respond(503, JSON_HEADERS + RETRY_AFTER, body)

    async def _metrics(self, request: HttpRequest) -> None:
        request.respond(200, METRICS_HEADERS, generate_latest(self.metrics.registry))

    async def _kv_snapshot(self, request: HttpRequest) -> None:
        """``GET /kv_snapshot``: the block index and event positions, for a peer started late
        (`kv_events.KvEventHub.snapshot`), as msgpack."""
        if self.kv is None:
            reject(request, ClientError(409, "this router follows no KV events"), self.metrics,
                   route=ADMIN_ROUTE)  # fmt: skip
            return
        snapshot = self.kv.snapshot()  # on the loop: the index does not change meanwhile
        body = await asyncio.to_thread(msgpack.packb, snapshot)  # the big part, off the loop
        request.respond(200, MSGPACK_HEADERS, body)

    def _snapshot_to_give(self) -> dict[str, Any] | None:
        """This router's KV snapshot for a peer over peering, None when it has none to give
        (it follows no KV events, or has heard no batch yet)."""
        if self.kv is None:
            return None
        snapshot = self.kv.snapshot()
        return snapshot if snapshot.get("streams") else None

    async def _seed_from_peer(self) -> None:
        """Take a peer router's snapshot before any worker is subscribed: from
        ``--kv-snapshot-from`` when given, else from the peers over peering, all at once.
        On failure the engines' replay buffers are all the catch-up there is."""
        config = self.config
        if config.kv_snapshot_from is not None:
            await self._seed_from_url(config.kv_snapshot_from)
        elif self.snapshots is not None and self.peering is not None:
            peers = [snapshot_endpoint(endpoint) for endpoint in self.peering.subscriptions]
            if peers and await self.snapshots.take_from(peers, self._seed) is None:
                log.info("no KV snapshot from any peer: starting from the engines' replay")

    async def _seed(self, body: bytes, source: str) -> None:
        """Seed the block index from a packed snapshot (ValueError when it cannot be read)."""
        assert self.kv is not None
        snapshot = await asyncio.to_thread(unpack_snapshot, body)
        taken = self.kv.seed(snapshot)
        log.info("KV snapshot from %s: %d event streams", source, taken)

    async def _seed_from_url(self, url: str) -> None:
        """``GET URL/kv_snapshot`` with the admin key of ``--kv-snapshot-key-file``, within
        ``--kv-snapshot-timeout`` and ``--kv-snapshot-max-bytes``."""
        config = self.config
        timeout = aiohttp.ClientTimeout(total=config.kv_snapshot_timeout_seconds)
        try:
            headers = {}
            if config.kv_snapshot_key_file is not None:
                key_file = Path(config.kv_snapshot_key_file)
                key = await asyncio.to_thread(key_file.read_text, encoding="utf-8")
                headers["Authorization"] = f"Bearer {key.strip()}"
            snapshot_url = normalize_worker_url(url)[0] + "/kv_snapshot"
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(snapshot_url, headers=headers) as response,
            ):
                response.raise_for_status()
                body = await read_bounded(response, config.kv_snapshot_max_bytes)
            await self._seed(body, url)
        except (OSError, aiohttp.ClientError, ValueError) as err:  # OSError: the key file too
            log.warning("no KV snapshot from %s: %s", url, err or type(err).__name__)

    def _model_cards(self) -> list[dict[str, Any]]:
        """The served models, then each one's loaded LoRA adapters as ``model:adapter`` with
        ``parent`` set (SGLang's cards list an adapter by its bare name, which a request
        cannot use across several models)."""
        return [
            {"id": name, "object": "model", "created": 0, "owned_by": "tpuserve",
             "root": model, "parent": None if name == model else model}
            for name, model in self.registry.served()
        ]  # fmt: skip

    async def _models(self, request: HttpRequest) -> None:
        data = self._model_cards()
        request.respond(200, JSON_HEADERS, orjson.dumps({"object": "list", "data": data}))

    async def _model(self, request: HttpRequest) -> None:
        """``GET /v1/models/{id}``: one card, or OpenAI's 404 listing the served names."""
        name = unquote(request.path.removeprefix(MODELS_PREFIX))
        card = next((c for c in self._model_cards() if c["id"] == name), None)
        if card is None:
            served = [n for n, _ in self.registry.served()]
            reject(request, model_not_found(repr(name), served), self.metrics, route="other")
            return
        request.respond(200, JSON_HEADERS, orjson.dumps(card))

    def _worker_states(self) -> list[WorkerState]:
        return [
            WorkerState(w.name, w.models, w.healthy, w.own_in_flight) for w in self.registry.workers
        ]


async def read_bounded(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """A response's body, or ValueError once it is longer than ``max_bytes``."""
    too_long = f"the snapshot is larger than --kv-snapshot-max-bytes {max_bytes}"
    if (response.content_length or 0) > max_bytes:
        raise ValueError(too_long)
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 20):
        body += chunk
        if len(body) > max_bytes:
            raise ValueError(too_long)
    return bytes(body)


def open_file_limit() -> int:
    """The process's open-file limit (soft RLIMIT_NOFILE; `cli` raises it to the hard one)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget(config: RouterConfig) -> int:
    """``max_connections``, lowered so that client connections, one upstream connection per
    request in flight and `FD_RESERVE` fit in the open-file limit: a router out of file
    descriptors can neither answer clients nor probe its workers."""
    room = open_file_limit() - config.max_in_flight - FD_RESERVE
    return max(1, min(config.max_connections, room))


def _current_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return "default"
