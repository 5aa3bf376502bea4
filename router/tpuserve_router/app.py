"""The router application: its parts wired together, their lifetimes, and request dispatch.

`create_router_app(config)` makes every part once, each after the parts it needs, and hands
each its hooks as it is made: the HTTP front (`server`), the generation routes (`forwarding`,
with `retry`'s rule and the hold queues, `hold`), the admin API (`admin`), worker admission
with its health checks and per-worker connection pools (`admission`), discovery (static or
Kubernetes, with the demand Lease, `demand`), KV-event subscriptions (`kv_events`, for a
policy with a block index unless ``--no-kv-events``), peering with the other router replicas
(`peers`, with ``--peer-port``; `peer_snapshot`, `kv_snapshot`: a replica started late takes
a peer's block index) and the metrics. The `RouterApp` it returns holds them:
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
  ``GET /kv_snapshot`` (the block index, for a replica started late: `kv_snapshot`).

Who may use which route, and dispatch by method and path, are `routes.Routes`'.

With ``--metrics-port``, that port serves ``/metrics``, ``/health`` and ``/readiness`` with
a connection budget of its own (`PROBE_CONNECTIONS`), so probes and scrapes are never locked
out by clients. Request bodies on every port share one budget (``--max-buffered-bytes``,
`connections.BufferBudget`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

import msgpack
import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.version import tpuserve_version
from tpuserve_router.config import RouterConfig, kv_events_enabled, read_token, snapshot_port
from tpuserve_router.core import RouterCore
from tpuserve_router.engines.admission import Admission
from tpuserve_router.engines.discovery.static import static_workers
from tpuserve_router.engines.engine_loads import LoadPoller
from tpuserve_router.engines.health import HealthChecker
from tpuserve_router.engines.outliers import Ejectable, OutlierDetector, outlier_config
from tpuserve_router.engines.worker_networks import is_loopback, parse_networks
from tpuserve_router.engines.workers import WorkerRegistry, WorkerSpec
from tpuserve_router.front.admin import ROUTE as ADMIN_ROUTE
from tpuserve_router.front.admin import AdminApi
from tpuserve_router.front.connections import BufferBudget, ConnectionBook
from tpuserve_router.front.forwarding import Forwarder
from tpuserve_router.front.http_request import HttpRequest
from tpuserve_router.front.replies import reject
from tpuserve_router.front.routes import MODELS_PREFIX, Routes
from tpuserve_router.front.server import RETRY_AFTER, FrontLimits, front_limits, serve
from tpuserve_router.front.unix_listener import remove_socket
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.kv.kv_events import KvEventHub
from tpuserve_router.metrics import (
    RouterMetrics,
    StateCollector,
    WorkerState,
    create_router_metrics,
    touch_known_series,
)
from tpuserve_router.peering.kv_snapshot import (
    Seeds,
    seed_from_peers,
    seed_from_url,
    snapshot_of,
    snapshot_to_give,
)
from tpuserve_router.peering.peer_auth import load_key
from tpuserve_router.peering.peer_snapshot import SnapshotService
from tpuserve_router.peering.peer_view import PeerView, new_router_id
from tpuserve_router.peering.peers import PeerNetwork
from tpuserve_router.pipeline.cancellation import Aborter
from tpuserve_router.pipeline.client import JSON_HEADERS
from tpuserve_router.pipeline.driver import make_driver
from tpuserve_router.pipeline.pd_settings import pd_workers
from tpuserve_router.pipeline.refusals import model_not_found
from tpuserve_router.pipeline.request_body import GENERATION_ROUTES, ClientError
from tpuserve_router.pipeline.stages import Pipeline
from tpuserve_router.pipeline.token_cache import ChatTokenCache
from tpuserve_router.policies.base import Policy, make_policy
from tpuserve_router.tenancy.auth import ApiKey, KeyStore
from tpuserve_router.tenancy.hold import HoldQueues, touch_hold_series
from tpuserve_router.tenancy.model_shares import demand_signals
from tpuserve_router.tenancy.quotas import Quotas
from tpuserve_router.validation import validate

if TYPE_CHECKING:
    from tpuserve_router.engines.discovery.kubernetes import PodWatcher
    from tpuserve_router.front.picker import EndpointPicker
    from tpuserve_router.tenancy.model_shares import ModelDemand

log = logging.getLogger(__name__)

ADMIT_BYTES: Final = 1024 * 1024
"""The buffer room (or ``--max-request-bytes``, the smaller) below which the HTTP port counts
as unable to admit: ``/readiness`` answers 503 while it cannot."""

METRICS_HEADERS: Final = f"content-type: {CONTENT_TYPE_LATEST}\r\n".encode()
MSGPACK_HEADERS: Final = b"content-type: application/msgpack\r\n"
PROBE_CONNECTIONS: Final = 64
"""The metrics port's own connection budget: probes and scrapes never wait for clients."""
PROBE_BODY_BYTES: Final = 1 << 16
ADMIN_HOST: Final = "127.0.0.1"
"""Where ``--admin-port`` listens (`admin_host`): only this host (this pod) reaches it."""
ADMIN_CONNECTIONS: Final = 64
ADMIN_BODY_BYTES: Final = 1 << 20
FD_RESERVE: Final = 512
"""Open files kept for what is not a client connection (listeners, health checks, idle
upstream pools, KV-event sockets, logs), beside one upstream connection per request."""


def create_router_app(
    config: RouterConfig,
    *,
    registry: CollectorRegistry | None = None,
    policy: Policy | None = None,
) -> RouterApp:
    """The router ``config`` describes, not started. Each part is made once, after the parts
    it needs, and handed its hooks as it is made: nothing is wired afterwards. ``registry``
    takes the metrics (a fresh one per test); ``policy`` replaces the configured one."""
    config = validate(config)
    params: dict[str, Any] = dict(config.policy_params)  # strings, converted by the policy
    policy = policy or make_policy(config.policy, seed=config.seed, **params)
    tokenizer = (
        ChatTokenCache(load_tokenizer(config.tokenizer), config.token_cache_bytes)
        if policy.needs_tokens
        else None
    )
    networks = parse_networks(config.worker_networks)
    metrics = create_router_metrics(registry or CollectorRegistry())
    metrics.info.labels(policy.name, tpuserve_version()).set(1)
    touch_known_series(metrics, policy.name)
    workers = WorkerRegistry()
    clock = time.monotonic
    outliers = OutlierDetector(
        outlier_config(config),
        lambda: workers.workers,
        functools.partial(_ejected, metrics, clock),
        clock,
    )

    seeds: Seeds | None = None
    kv: KvEventHub | None = None
    if kv_events_enabled(config.kv_events, policy):
        if policy.block_index is None:
            log.warning(
                "--kv-events has no effect with policy %s (it keeps no block index); "
                "use precise or cost",
                policy.name,
            )
        else:
            seeds = Seeds(policy.block_index)
            kv = KvEventHub(
                policy.block_index, metrics, resume=seeds.resume,
                lost=getattr(policy, "remember_lost", None),
            )  # fmt: skip

    peering: PeerNetwork | None = None
    snapshots: SnapshotService | None = None
    if config.peer_port:
        key = load_key(config.peer_key_file)
        view = PeerView(
            new_router_id(), policy, workers.get, clock=clock,
            max_open_per_peer=config.max_in_flight,
            open_ttl_seconds=config.request_timeout_seconds,
        )  # fmt: skip
        peering = PeerNetwork(
            view, metrics, host=config.host, port=config.peer_port, peers=config.peers,
            dns_name=config.peers_from_dns, refresh_seconds=config.peers_refresh_interval_seconds,
            key=key,
        )  # fmt: skip
        snapshots = SnapshotService(
            functools.partial(snapshot_to_give, kv), host=config.host,
            port=snapshot_port(config.peer_port),
            timeout_seconds=config.kv_snapshot_timeout_seconds,
            max_bytes=config.kv_snapshot_max_bytes, key=key,
        )  # fmt: skip

    core = RouterCore(config, policy, workers, metrics, peering.link if peering else None)
    # The HTTP port's bodies and the picker's are two budgets: neither front can starve the
    # other (the picker's share is carved out of --max-buffered-bytes).
    buffers = BufferBudget(config.http_buffer_bytes(), config.client_buffer_bytes())
    holds = HoldQueues(
        config.hold_max_requests, config.hold_max_seconds, metrics,
        max_bytes=config.max_buffered_bytes // 2, model_share=config.hold_model_share,
    )  # fmt: skip
    if holds.enabled:
        for model in config.hold_models:
            touch_hold_series(metrics, model)
    # The hold queues hear of every change that may make a worker routable, after the policy.
    admission = Admission(core, networks, kv, on_routable=holds.announce)
    loads: LoadPoller | None = None
    if config.load_poll_interval_seconds > 0:
        loads = LoadPoller(
            workers,
            policy.queued_prefill_tokens,
            interval_seconds=config.load_poll_interval_seconds,
            timeout_seconds=config.health_check_timeout_seconds,
            engine_type=config.engine_type,
        )
    quotas = Quotas()
    keys: KeyStore | None = None
    if config.api_keys_file is not None:
        keys = KeyStore(
            config.api_keys_file,
            config.api_keys_reload_seconds,
            functools.partial(_keys_reloaded, metrics, quotas),
        )
        metrics.api_keys.labels().set(len(keys.keys))
    aborter = Aborter(
        lambda: admission.health.session,
        lambda worker, reason: metrics.upstream_aborts.labels(worker, reason).inc(),
    )

    discovery: PodWatcher | None = None
    demand: ModelDemand | None = None
    if config.discovery == "kubernetes":
        from tpuserve_router.engines.discovery.kubernetes import ApiServer, PodRules, PodWatcher

        rules = PodRules.from_flags(
            config.leader_label,
            config.worker_port,
            config.worker_url_annotation,
            networks,
            config.model_label,
        )
        namespace = config.namespace or _current_namespace()
        api = ApiServer.load()
        discovery = PodWatcher(
            api, namespace, config.selector, rules, functools.partial(apply_discovered, workers)
        )
        demand = demand_signals(api, namespace, config, metrics, holds, lambda: pipeline)

    driver = make_driver(
        core,
        tokenizer,
        outliers,
        aborter,
        holds,
        keys=keys,
        quotas=quotas,
        # decisions see the KV events at most an interval late
        before_decision=kv.readers.read_if_due if kv is not None else None,
        on_arrival=demand.arrived if demand is not None else None,
        session=lambda: admission.health.session,
    )
    pipeline = driver.pipeline
    forwarder = Forwarder(driver)
    picker: EndpointPicker | None = None
    if config.picker_port is not None:  # grpc is imported only when the picker is on
        from tpuserve_router.front.picker import EndpointPicker

        token = None if config.picker_token_file is None else read_token(config.picker_token_file)
        picker = EndpointPicker(
            driver, test_headers=config.picker_test_headers, tls=config.picker_tls,
            buffers=BufferBudget(config.picker_buffer_bytes()), token=token,
        )  # fmt: skip
    admin = AdminApi(
        workers,
        policy,
        admission.health,
        metrics,
        networks,
        lambda: discovery.rejected if discovery is not None else [],
    )
    limits = front_limits(config, connection_budget(config))
    closed = functools.partial(_closed, metrics)
    book = ConnectionBook(limits.max_connections, limits.tick_seconds, closed, buffers)
    probe_book = ConnectionBook(PROBE_CONNECTIONS, limits.tick_seconds, closed)
    admin_book = ConnectionBook(ADMIN_CONNECTIONS, limits.tick_seconds, closed, buffers)
    metrics.registry.register(
        StateCollector(
            functools.partial(_worker_states, workers),
            lambda: (
                policy.index_sizes()  # and the token cache's bytes
                | ({"token_cache_bytes": tokenizer.cached_bytes} if tokenizer is not None else {})
            ),
            lambda: len(book.open),
            lambda: buffers.used + (picker.buffers.used if picker is not None else 0),
            policy.failover_routes,
        )
    )
    return RouterApp(
        config=config, policy=policy, tokenizer=tokenizer, metrics=metrics, registry=workers,
        outliers=outliers, kv=kv, seeds=seeds, peering=peering, snapshots=snapshots,
        admission=admission, loads=loads, keys=keys, aborter=aborter, discovery=discovery,
        demand=demand, pipeline=pipeline, forwarder=forwarder, admin=admin, limits=limits,
        book=book, probe_book=probe_book, admin_book=admin_book, picker=picker,
    )  # fmt: skip


def apply_discovered(workers: WorkerRegistry, specs: list[WorkerSpec]) -> None:
    """Make the discovered workers exactly ``specs`` (admin-added ones stay)."""
    added, removed = workers.sync(specs)
    if added or removed:
        log.info("workers added: %s; removed: %s", added or "none", removed or "none")


def _ejected(
    metrics: RouterMetrics, clock: Callable[[], float], worker: Ejectable, reason: str
) -> None:
    metrics.worker_ejections.labels(worker.name, reason).inc()
    log.warning(
        "worker %s ejected (%s) for %.0f s: %d consecutive failures, %d of %d requests "
        "failed this interval",
        worker.name,
        reason,
        worker.ejected_until - clock(),
        worker.consecutive_failures,
        worker.window_failures,
        worker.window_requests,
    )


def _keys_reloaded(
    metrics: RouterMetrics, quotas: Quotas, result: str, keys: Mapping[bytes, ApiKey]
) -> None:
    metrics.api_key_reloads.labels(result).inc()
    metrics.api_keys.labels().set(len(keys))
    if result == "ok":
        quotas.keep_only(keys)


def _closed(metrics: RouterMetrics, reason: str) -> None:
    metrics.connections_closed.labels(reason).inc()


def _worker_states(workers: WorkerRegistry) -> list[WorkerState]:
    return [
        WorkerState(w.name, w.models, w.healthy, w.own_in_flight, w.engine_type, w.engine_load)
        for w in workers.workers
    ]


@dataclass(eq=False, repr=False, kw_only=True)
class RouterApp:
    """The router's parts, as `create_router_app` made them: ``start`` listens and starts
    what runs in the background, ``stop`` ends it all; requests are dispatched by method and
    path."""

    config: RouterConfig
    policy: Policy
    tokenizer: ChatTokenCache | None
    metrics: RouterMetrics
    registry: WorkerRegistry
    outliers: OutlierDetector
    kv: KvEventHub | None
    seeds: Seeds | None
    peering: PeerNetwork | None
    snapshots: SnapshotService | None
    admission: Admission
    loads: LoadPoller | None
    keys: KeyStore | None
    aborter: Aborter
    discovery: PodWatcher | None
    demand: ModelDemand | None
    pipeline: Pipeline
    forwarder: Forwarder
    admin: AdminApi
    limits: FrontLimits
    book: ConnectionBook
    probe_book: ConnectionBook
    admin_book: ConnectionBook
    picker: EndpointPicker | None = None
    """The Endpoint Picker protocol's gRPC server (``--picker-port``), if on."""
    routes: Routes = field(init=False)
    """The route tables and who may use them, filled here."""
    _servers: list[asyncio.Server] = field(default_factory=list, init=False)
    _admin_server: asyncio.Server | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.routes = routes = Routes(self.config, self.keys, self.metrics)
        admin = routes.admin_only
        routes.post.update(
            {
                "/workers": admin(self.admin.add_worker),
                "/flush_cache": admin(self.admin.flush_cache),
                "/add_worker": admin(self.admin.add_worker),
                "/remove_worker": admin(self.admin.remove_worker),
            }
        )
        for route, parser in GENERATION_ROUTES.items():
            routes.post[route] = self.forwarder.handler(route, parser)
        routes.model_card = self._model if self.keys is None else routes.keyed(self._model)
        routes.get.update(
            {
                "/v1/models": self._models if self.keys is None else routes.keyed(self._models),
                "/health": self._health,
                "/readiness": self._readiness,
                "/metrics": self._metrics,
                "/workers": admin(self.admin.list_workers),
                "/kv_snapshot": admin(self._kv_snapshot),
            }
        )
        routes.delete["/workers"] = admin(self.admin.remove_worker)
        routes.seal()

    # ================================================================== lifetime

    @property
    def health(self) -> HealthChecker:
        return self.admission.health

    @property
    def block_index(self) -> BlockIndex | None:
        return self.policy.block_index

    @property
    def port(self) -> int:
        """The port the front listens on (useful with port 0); 0 on a unix socket (``uds``)."""
        if self.config.uds is not None:
            return 0
        return int(self._servers[0].sockets[0].getsockname()[1])

    @property
    def metrics_port(self) -> int | None:
        if len(self._servers) < 2:
            return None
        return int(self._servers[1].sockets[0].getsockname()[1])

    @property
    def admin_port(self) -> int | None:
        """The port of ``--admin-port``'s listener (on `ADMIN_HOST`), if it has one."""
        server = self._admin_server
        return None if server is None else int(server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``, or ``unix:PATH`` when the front listens on a unix socket."""
        if self.config.uds is not None:
            return f"unix:{self.config.uds}"
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
        front = await serve(
            self.routes.handle, config.host, config.port, self.limits, self.book,
            self.routes.head_check, self.routes.client_of, uds=config.uds,
        )  # fmt: skip
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
        if config.admin_port is not None:
            admin_limits = dataclasses.replace(
                self.limits, max_connections=ADMIN_CONNECTIONS, max_body_bytes=ADMIN_BODY_BYTES
            )
            self._admin_server = await serve(
                self.routes.handle_admin, admin_host(config.host), config.admin_port, admin_limits,
                self.admin_book, self.routes.admin_head_check, self.routes.client_of,
            )  # fmt: skip
            self._servers.append(self._admin_server)
        if self.picker is not None and config.picker_port is not None:
            await self.picker.start(config.host, config.picker_port)
        self.admission.start()
        if self.loads is not None:
            self.loads.start()
        if self.seeds is not None:  # before any worker is subscribed
            await self._seed(self.seeds)
        self.outliers.start()
        if self.keys is not None:
            self.keys.start()
        if self.discovery is not None:
            self.discovery.start()
            if self.demand is not None:
                self.demand.start()
        else:
            apply_discovered(
                self.registry,
                static_workers(config.workers) + pd_workers(config.prefill, config.decode),
            )
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
        self.pipeline.holds.refuse_all("the router is stopping; retry")
        if self.demand is not None:
            await self.demand.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        for server in self._servers:
            server.close()
        deadline = time.monotonic() + self.config.drain_seconds
        if self.picker is not None:  # its streams in hand share the drain time
            await self.picker.stop(self.config.drain_seconds)
        while len(self.book.open) > len(self.book.waiting):  # requests still in hand
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for book in (self.book, self.probe_book, self.admin_book):
            book.stop()
            for conn in list(book.open):
                conn.evict()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self.config.uds is not None:
            remove_socket(self.config.uds)
        self._admin_server = None
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

    # ================================================================== dispatch

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

    # ================================================================== the router's own state

    async def _health(self, request: HttpRequest) -> None:
        request.respond(200, JSON_HEADERS, b'{"status":"ok"}')

    async def _readiness(self, request: HttpRequest) -> None:
        """Ready with a routable worker, or while requests can be held for one (scale from
        zero: the router must take requests at zero replicas to signal demand), and while
        the HTTP port can admit a request (`admits`; the picker's readiness is its gRPC
        health, which follows its own shares)."""
        healthy = self.registry.healthy_count()
        holding = self.pipeline.holds.enabled
        admits = self.admits()
        ready = (healthy > 0 or holding) and admits
        body = orjson.dumps(
            {
                "ready": ready,
                "healthy_workers": healthy,
                "workers": len(self.registry.workers),
                "holding": holding,
                "admits": admits,
            }
        )
        if ready:
            request.respond(200, JSON_HEADERS, body)
        else:
            request.respond(503, JSON_HEADERS + RETRY_AFTER, body)

    def admits(self) -> bool:
        """Whether the HTTP port can take a request now: under ``--max-in-flight``, with
        room in its buffer budget for a body (`ADMIT_BYTES` or ``--max-request-bytes``, the
        smaller)."""
        room = min(ADMIT_BYTES, self.config.max_request_bytes)
        in_flight = self.pipeline.in_flight < self.config.max_in_flight
        return in_flight and self.book.buffers.free >= room

    async def _metrics(self, request: HttpRequest) -> None:
        request.respond(200, METRICS_HEADERS, generate_latest(self.metrics.registry))

    async def _kv_snapshot(self, request: HttpRequest) -> None:
        """``GET /kv_snapshot``: the block index and event positions, for a peer started late
        (`kv_snapshot.snapshot_of`), as msgpack."""
        if self.kv is None:
            reject(request, ClientError(409, "this router follows no KV events"), self.metrics,
                   route=ADMIN_ROUTE)  # fmt: skip
            return
        snapshot = snapshot_of(self.kv)  # on the loop: the index does not change meanwhile
        body = await asyncio.to_thread(msgpack.packb, snapshot)  # the big part, off the loop
        request.respond(200, MSGPACK_HEADERS, body)

    async def _seed(self, seeds: Seeds) -> None:
        """Take a peer router's KV snapshot: from ``--kv-snapshot-from`` when given, else from
        the peers over peering, all at once (`kv_snapshot`)."""
        if self.config.kv_snapshot_from is not None:
            await seed_from_url(seeds, self.config.kv_snapshot_from, self.config)
        elif self.snapshots is not None and self.peering is not None:
            await seed_from_peers(seeds, self.snapshots, self.peering.subscriptions)

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


def admin_host(host: str) -> str:
    """Where ``--admin-port`` listens: `ADMIN_HOST`, or ``--host`` when that is a loopback
    address already (a local fleet's pods each have one of their own)."""
    return host if is_loopback(host) else ADMIN_HOST


def open_file_limit() -> int:
    """The process's open-file limit (soft RLIMIT_NOFILE; `cli` raises it to the hard one)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget(config: RouterConfig) -> int:
    """``max_connections``, lowered so that client connections, one upstream connection per
    request in flight and `FD_RESERVE` fit in the open-file limit: a router out of file
    descriptors can neither answer clients nor probe its workers."""
    room = open_file_limit() - config.max_in_flight - FD_RESERVE
    if config.picker_port is not None:  # the picker's gateway connections have their own cap
        # each is three descriptors: the gate's two ends of its relay and gRPC's own socket
        room -= 3 * config.picker_max_connections
    return max(1, min(config.max_connections, room))


def _current_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return "default"
