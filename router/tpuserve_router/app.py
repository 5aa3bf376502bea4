"""The router application: its routes, the proxy hot path, admin endpoints and lifetimes.

`RouterApp(config)` owns everything that runs: the HTTP front (`server`), the worker
registry with per-worker connection pools (`proxy`), active health checks (`health`),
discovery (static or Kubernetes), KV-event subscriptions (`kv_events`, for a policy with a
block index unless ``--no-kv-events``) and the metrics. ``await app.start()`` listens and
starts the background tasks; ``await app.stop()`` cancels and awaits every one of them.

Routes (the router speaks SGLang's API, so it fronts real SGLang, the engine twin or any
SGLang-compatible server):

- ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /generate``: routed by
  the policy and proxied; streams pass through chunk by chunk;
- ``GET /v1/models``: the models the workers serve;
- ``GET /health`` (the router is up), ``GET /readiness`` (at least one routable worker),
  ``GET /metrics``;
- admin: ``GET /workers``, ``POST /workers`` (``{"url": ...}``), ``DELETE /workers``
  (``{"url": ...}`` or ``?url=``), ``POST /flush_cache`` (sent to every worker).

A generation request's life: parse and validate the body (400 naming the field), find
the workers serving its model (404), ask the policy (503 with Retry-After if none is
healthy), count it in flight on the chosen worker, send it. A failure before the first
byte reaches the client (connect error, reset, 429/502/503/504) is retried on another
worker, at most ``max_retries`` times; nothing is retried once the client has received
bytes. A stream that breaks ends with an SSE error event and the connection closes. The
in-flight count is decremented in a ``finally``, so it returns to zero on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.block_index import BlockIndex
from tpuserve_router.config import RouterConfig, kv_events_enabled
from tpuserve_router.discovery.static import static_workers
from tpuserve_router.health import HealthChecker
from tpuserve_router.kv_events import Endpoints, KvEventHub
from tpuserve_router.metrics import (
    RouterMetrics,
    StateCollector,
    WorkerState,
    create_router_metrics,
    remove_worker_series,
    touch_known_series,
    touch_token_series,
    touch_worker_series,
)
from tpuserve_router.policies.base import (
    Decision,
    NoHealthyWorker,
    Policy,
    RouteRequest,
    make_policy,
)
from tpuserve_router.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.request_body import (
    GENERATION_ROUTES,
    ClientError,
    Parser,
    parse_json_object,
)
from tpuserve_router.server import JSON_HEADERS, Handler, HttpConnection, HttpRequest, serve
from tpuserve_router.token_cache import ChatTokenCache
from tpuserve_router.usage import Usage, usage_from_body, usage_from_stream_tail
from tpuserve_router.version import router_version
from tpuserve_router.worker_networks import endpoint_problem, parse_networks, url_problem
from tpuserve_router.workers import (
    BreakerConfig,
    InvalidWorkerURL,
    Worker,
    WorkerRegistry,
    WorkerSpec,
)

if TYPE_CHECKING:
    from tpuserve_router.discovery.kubernetes import PodWatcher

log = logging.getLogger(__name__)

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"expect",
    }
)
RETRYABLE_STATUSES: Final = frozenset({429, 502, 503, 504})
BREAKER_STATUSES: Final = frozenset({502, 504})  # the worker, not its load, is at fault
RETRY_AFTER_SECONDS: Final = "1"
CLIENT_CLOSED: Final = "499"  # nginx's code for "the client went away first"
STREAM_ERROR: Final = "stream_error"
METRICS_HEADERS: Final = f"content-type: {CONTENT_TYPE_LATEST}\r\n".encode()
SHUTDOWN_GRACE_SECONDS: Final = 5.0

_RETRY = None  # what an attempt returns when the request should go to another worker


def sse_error_event(message: str, status: int = 502) -> bytes:
    """The SSE event that ends a stream whose worker failed mid-way."""
    error = {"message": message, "type": "upstream_error", "param": None, "code": status}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


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
        self.want_text = self.policy.needs_text
        self.networks = parse_networks(config.worker_networks)
        self.metrics: RouterMetrics = create_router_metrics(registry or CollectorRegistry())
        self.metrics.info.labels(self.policy.name, router_version()).set(1)
        touch_known_series(self.metrics, self.policy.name)
        self.registry = WorkerRegistry(
            BreakerConfig(config.breaker_failure_threshold, config.breaker_open_seconds)
        )
        self.registry.on_added.append(self._worker_added)
        self.registry.on_removed.append(self._worker_removed)
        self.registry.on_changed.append(self._workers_changed)
        self.health = HealthChecker(
            self.registry,
            interval_seconds=config.health_check_interval_seconds,
            timeout_seconds=config.health_check_timeout_seconds,
            failure_threshold=config.health_failure_threshold,
            success_threshold=config.health_success_threshold,
            on_admitted=self._admitted,
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
        self.metrics.registry.register(StateCollector(self._worker_states, self.policy.index_sizes))
        self._post: dict[str, Handler] = {
            "/workers": self._add_worker,
            "/flush_cache": self._flush_cache,
            "/add_worker": self._add_worker,
            "/remove_worker": self._remove_worker,
        }
        for route, parser in GENERATION_ROUTES.items():
            self._post[route] = self._generation_handler(route, parser)
        self._get: dict[str, Handler] = {
            "/v1/models": self._models,
            "/health": self._health,
            "/readiness": self._readiness,
            "/metrics": self._metrics,
            "/workers": self._list_workers,
        }
        self._delete: dict[str, Handler] = {
            "/workers": self._remove_worker,
        }
        self._decisions = {
            o: self.metrics.decisions.labels(self.policy.name, o)
            for o in ("prefix_hit", "miss", "balanced_away", "load_only")
        }
        self._ratio_predicted = self.metrics.prefix_match_ratio.labels(
            self.policy.name, "predicted"
        )
        self._ratio_actual = self.metrics.prefix_match_ratio.labels(self.policy.name, "actual")
        self._servers: list[asyncio.Server] = []
        self._connections: weakref.WeakSet[HttpConnection] = weakref.WeakSet()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._discovery: PodWatcher | None = None
        self._started = False

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
        loop = asyncio.get_running_loop()
        front = await serve(
            self._handle, config.host, config.port, config.max_request_bytes, self._connections
        )
        self._servers.append(front)
        if config.metrics_port is not None:
            self._servers.append(
                await loop.create_server(
                    lambda: HttpConnection(self._handle_metrics_only, 1 << 16, loop),
                    config.host,
                    config.metrics_port,
                    reuse_address=True,
                )
            )
        self.health.start()
        self._started = True
        if config.discovery == "kubernetes":
            from tpuserve_router.discovery.kubernetes import ApiServer, PodRules, PodWatcher

            rules = PodRules.from_flags(
                config.leader_label,
                config.worker_port,
                config.worker_url_annotation,
                self.networks,
            )
            namespace = config.namespace or _current_namespace()
            self._discovery = PodWatcher(
                ApiServer.load(), namespace, config.selector, rules, self.apply_discovered
            )
            self._discovery.start()
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
        if self._discovery is not None:
            await self._discovery.stop()
            self._discovery = None
        for server in self._servers:
            server.close()
        deadline = time.monotonic() + SHUTDOWN_GRACE_SECONDS
        while any(c.task is not None for c in self._connections):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self._connections):
            conn.abort()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        await self.health.stop()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.kv is not None:
            await self.kv.stop()
        for worker in self.registry.workers:
            if worker.pool is not None:
                worker.pool.close()
        self._started = False

    def apply_discovered(self, specs: list[WorkerSpec]) -> None:
        """Make the discovered workers exactly ``specs`` (admin-added ones stay)."""
        added, removed = self.registry.sync(specs)
        if added or removed:
            log.info("workers added: %s; removed: %s", added or "none", removed or "none")

    # ================================================================== worker lifecycle

    def _worker_added(self, worker: Worker) -> None:
        worker.pool = UpstreamPool(
            worker.host,
            worker.port,
            connect_timeout_seconds=self.config.connect_timeout_seconds,
            max_idle=self.config.max_idle_connections_per_worker,
        )
        self.metrics.workers_changed.labels("added").inc()
        touch_worker_series(self.metrics, worker.name, kv_events=self.kv is not None)
        if self._started:
            self.health.watch(worker)

    def _worker_removed(self, worker: Worker) -> None:
        worker.healthy = False
        if worker.pool is not None:
            worker.pool.close()
        self.metrics.workers_changed.labels("removed").inc()
        remove_worker_series(self.metrics, worker.name)
        if self.kv is not None:
            self._spawn(self.kv.unwatch(worker.name))

    def _workers_changed(self, registry: WorkerRegistry) -> None:
        self.policy.on_workers_changed(registry.names())

    async def _admitted(self, worker: Worker) -> None:
        """A worker became routable: learn its models and its KV-event endpoints."""
        try:
            listing = await self.health.get_json(worker.name + "/v1/models")
            data = listing.get("data") if isinstance(listing, dict) else None
            if isinstance(data, list):
                ids = [
                    m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                ]
                self.registry.set_models(worker, ids)
        except Exception as err:  # an engine without /v1/models still serves any model
            log.info("worker %s: could not list models (%s)", worker.name, err)
        if self.registry.get(worker.name) is worker:
            for model in worker.models:  # token series exist at zero before the first answer
                touch_token_series(self.metrics, model, worker.name)
        if self.kv is not None and self.registry.get(worker.name) is worker:
            endpoints = await self._kv_endpoints(worker)
            problem = self._kv_endpoints_problem(endpoints) if endpoints is not None else None
            if problem:
                log.warning("worker %s: not subscribing to KV events: %s", worker.name, problem)
            elif endpoints is not None:
                await self.kv.watch(worker.name, endpoints)
            else:
                log.warning(
                    "worker %s publishes no KV events; its routing stays approximate", worker.name
                )

    def _kv_endpoints_problem(self, endpoints: Endpoints) -> str | None:
        for endpoint in (endpoints.events, endpoints.replay):
            problem = endpoint_problem(endpoint, self.networks) if endpoint else None
            if problem:
                return problem
        return None

    async def _kv_endpoints(self, worker: Worker) -> Endpoints | None:
        if worker.kv_events_endpoint:
            return Endpoints(worker.kv_events_endpoint, worker.kv_replay_endpoint)
        try:
            info = await self.health.get_json(worker.name + "/get_server_info")
        except Exception as err:
            log.info("worker %s: no server info (%s)", worker.name, err)
            return None
        if not isinstance(info, dict):
            return None
        raw = info.get("kv_events_config")
        try:
            kv_config = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return None
        if not isinstance(kv_config, dict) or kv_config.get("publisher", "zmq") != "zmq":
            return None
        endpoint = kv_config.get("endpoint")
        if not isinstance(endpoint, str):
            return None
        replay = kv_config.get("replay_endpoint")
        return Endpoints(
            _dialable(endpoint, worker.host),
            _dialable(replay, worker.host) if isinstance(replay, str) else None,
        )

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
        if path in self._post or path in self._get or path in self._delete:
            allowed = [
                m
                for m, t in (("GET", self._get), ("POST", self._post), ("DELETE", self._delete))
                if path in t
            ]
            self._reply_error(
                request,
                ClientError(
                    405,
                    f"method {method.decode('latin-1')} is not allowed on {path}; "
                    f"allowed: {', '.join(allowed)}",
                    param="method",
                    headers={"allow": ", ".join(allowed)},
                ),
                route="other",
            )
            return
        self._reply_error(
            request,
            ClientError(404, f"no route {path}", param="path", error_type="not_found_error"),
            route="other",
        )

    async def _handle_metrics_only(self, request: HttpRequest) -> None:
        if request.path == "/metrics":
            await self._metrics(request)
        else:
            request.respond(404, JSON_HEADERS, b'{"error": "only /metrics is served here"}')

    # ================================================================== generation hot path

    def _generation_handler(self, route: str, parser: Parser) -> Handler:
        return functools.partial(self._generate, route=route, parser=parser)

    async def _generate(self, request: HttpRequest, route: str, parser: Parser) -> None:
        try:
            parsed = parser(parse_json_object(request.body), self.want_text, self.tokenizer)
        except ClientError as err:
            self._reply_error(request, err, route)
            return
        model = parsed.model
        candidates = self.registry.candidates(model)
        if candidates is None:
            known = ", ".join(self.registry.known_models()) or "none"
            self._reply_error(
                request,
                ClientError(
                    404,
                    f"model {model!r} is not served by this router; available: {known}",
                    param="model",
                    error_type="model_not_found",
                ),
                route,
            )
            return
        route_request = RouteRequest(model, parsed.text, parsed.token_ids)
        forwarded = _forwarded_headers(request)
        excluded: list[Worker] = []
        attempt = 0
        policy = self.policy
        while True:
            pool = candidates if not excluded else [w for w in candidates if w not in excluded]
            try:
                decision = policy.choose(route_request, pool)
            except NoHealthyWorker:
                self._reply_error(
                    request,
                    ClientError(
                        503,
                        f"no healthy worker for model {model!r}" if model else "no healthy worker",
                        error_type="service_unavailable",
                        headers={"retry-after": RETRY_AFTER_SECONDS},
                    ),
                    route,
                    model,
                )
                return
            self._decisions[decision.outcome].inc()
            status = await self._attempt(
                request, route, model, parsed.stream, decision, forwarded,
                attempt < self.config.max_retries and len(pool) > 1, pool,
            )  # fmt: skip
            if status is not _RETRY:
                return
            excluded.append(decision.worker)
            attempt += 1
            self.metrics.retries.labels(route).inc()

    async def _attempt(
        self,
        request: HttpRequest,
        route: str,
        model: str,
        stream: bool,
        decision: Decision[Worker],
        forwarded: bytes,
        may_retry: bool,
        pool_of_workers: list[Worker],
    ) -> str | None:
        """One try on the decided worker; returns the status answered, or None to retry.

        ``may_retry``: retries are left and there are other workers; whether one of them
        is healthy is checked only when a retry is wanted.
        """
        worker = decision.worker
        policy = self.policy
        if not model and worker.models:
            model = worker.models[0]
        pool: UpstreamPool = worker.pool
        upstream: UpstreamConnection | None = None
        succeeded = False
        status_label: str | None = CLIENT_CLOSED  # None: retried, not answered
        worker.in_flight += 1
        try:
            payload = _upstream_request(request, pool.host_header, forwarded)
            try:
                upstream = await self._open(pool, payload, request.arrived)
            except UpstreamError as err:
                self.metrics.upstream_errors.labels(worker.name, err.reason).inc()
                worker.request_failed()
                if err.reason == "first_byte_timeout":
                    status_label = "504"
                    self._reply_error(
                        request,
                        ClientError(
                            504, f"worker did not answer: {err.detail}", error_type="timeout"
                        ),
                        route,
                        model,
                        worker.name,
                        count=False,
                    )
                    return status_label
                if may_retry and _other_healthy(worker, pool_of_workers):
                    status_label = None
                    return _RETRY
                status_label = "502"
                self._reply_error(
                    request,
                    ClientError(
                        502, f"worker unavailable: {err.detail}", error_type="upstream_error"
                    ),
                    route,
                    model,
                    worker.name,
                    count=False,
                )
                return status_label
            status = upstream.status
            if (
                status in RETRYABLE_STATUSES
                and may_retry
                and _other_healthy(worker, pool_of_workers)
            ):
                self.metrics.upstream_errors.labels(worker.name, "retryable_status").inc()
                if status in BREAKER_STATUSES:
                    worker.request_failed()
                status_label = None
                return _RETRY
            headers = _response_headers(upstream.headers)
            usage: Usage | None
            if upstream.header(b"content-length") is not None or not _is_chunked(upstream):
                try:
                    body = await upstream.read_all()
                except UpstreamError as err:
                    self.metrics.upstream_errors.labels(worker.name, err.reason).inc()
                    worker.request_failed()
                    if (
                        err.reason != "request_timeout"
                        and may_retry
                        and _other_healthy(worker, pool_of_workers)
                    ):
                        status_label = None
                        return _RETRY
                    code = 504 if err.reason == "request_timeout" else 502
                    status_label = str(code)
                    self._reply_error(
                        request,
                        ClientError(
                            code,
                            f"worker failed mid-response: {err.detail}",
                            error_type="upstream_error",
                        ),
                        route,
                        model,
                        worker.name,
                        count=False,
                    )
                    return status_label
                policy.on_prefill_done(decision)
                request.respond(status, headers, body)
                usage = usage_from_body(body) if status == 200 else None
            else:
                request.start_chunked(status, headers)
                first = True
                before = last = b""
                try:
                    while True:
                        data = await upstream.read()
                        if not data:
                            break
                        if first:
                            first = False
                            policy.on_prefill_done(decision)
                            if stream:
                                self.metrics.ttft.labels(model).observe(
                                    time.monotonic() - request.arrived
                                )
                        request.write_chunk(data)
                        before, last = last, data
                        if request.write_paused:
                            await request.drain()
                except UpstreamError as err:
                    self.metrics.upstream_errors.labels(worker.name, err.reason).inc()
                    worker.request_failed()
                    request.write_chunk(sse_error_event(f"the worker's stream broke: {err.detail}"))
                    request.end_chunked(keep_alive=False)
                    status_label = STREAM_ERROR
                    return status_label
                request.end_chunked()
                usage = usage_from_stream_tail(before + last) if status == 200 else None
            succeeded = status < 400
            if status < 500:
                worker.request_succeeded()
            status_label = str(status)
            if usage is not None:
                self._account(usage, decision, model, worker.name)
            return status_label
        finally:
            worker.in_flight -= 1
            if upstream is not None:
                pool.release(upstream)
            policy.on_request_done(decision, succeeded)
            if status_label is not None:
                self._count(model, worker.name, route, status_label)
                if status_label != CLIENT_CLOSED:
                    self.metrics.e2e.labels(model, route).observe(
                        time.monotonic() - request.arrived
                    )

    async def _open(self, pool: UpstreamPool, payload: bytes, arrived: float) -> UpstreamConnection:
        """Send ``payload`` and wait for the response head; a stale pooled connection is
        replaced once by a fresh one (the worker closed it while idle)."""
        upstream = await pool.acquire()
        try:
            return await self._send(upstream, payload, arrived)
        except UpstreamError as err:
            upstream.close()
            if err.reason != "reset_before_response" or not upstream.reused:
                raise
        except BaseException:
            upstream.close()
            raise
        upstream = await pool.connect()
        try:
            return await self._send(upstream, payload, arrived)
        except BaseException:
            upstream.close()
            raise

    async def _send(
        self, upstream: UpstreamConnection, payload: bytes, arrived: float
    ) -> UpstreamConnection:
        upstream.send(payload)
        left = self.config.request_timeout_seconds - (time.monotonic() - arrived)
        upstream.set_deadlines(self.config.first_byte_timeout_seconds, max(0.001, left))
        await upstream.wait_head()
        return upstream

    def _account(self, usage: Usage, decision: Decision[Worker], model: str, worker: str) -> None:
        metrics = self.metrics
        prompt = usage.prompt_tokens
        metrics.prompt_tokens.labels(model, worker).inc(prompt)
        metrics.completion_tokens.labels(model, worker).inc(usage.completion_tokens)
        metrics.cached_tokens.labels(model, worker).inc(usage.cached_tokens)
        predicted = metrics.predicted_cached_tokens.labels(model, worker)  # exists at zero too
        ratio = decision.predicted_match_ratio
        if ratio is not None and prompt > 0:
            predicted.inc(round(ratio * prompt))
            self._ratio_predicted.observe(ratio)
            self._ratio_actual.observe(min(1.0, usage.cached_tokens / prompt))

    def _count(self, model: str, worker: str, route: str, status: str) -> None:
        self.metrics.requests.labels(model, worker, route, status).inc()

    def _reply_error(
        self,
        request: HttpRequest,
        err: ClientError,
        route: str,
        model: str = "",
        worker: str = "none",
        *,
        count: bool = True,
    ) -> None:
        headers = JSON_HEADERS + b"".join(
            f"{k}: {v}\r\n".encode("latin-1") for k, v in err.headers.items()
        )
        request.respond(err.status, headers, err.body())
        if count:
            self._count(model, worker, route, str(err.status))

    # ================================================================== small endpoints

    async def _health(self, request: HttpRequest) -> None:
        request.respond(200, JSON_HEADERS, b'{"status":"ok"}')

    async def _readiness(self, request: HttpRequest) -> None:
        healthy = self.registry.healthy_count()
        body = orjson.dumps(
            {
                "ready": healthy > 0,
                "healthy_workers": healthy,
                "workers": len(self.registry.workers),
            }
        )
        if healthy:
            request.respond(200, JSON_HEADERS, body)
        else:
            request.respond(
                503, JSON_HEADERS + b"retry-after: " + RETRY_AFTER_SECONDS.encode() + b"\r\n", body
            )

    async def _metrics(self, request: HttpRequest) -> None:
        request.respond(200, METRICS_HEADERS, generate_latest(self.metrics.registry))

    async def _models(self, request: HttpRequest) -> None:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "tpuserve"}
            for m in self.registry.known_models()
        ]
        request.respond(200, JSON_HEADERS, orjson.dumps({"object": "list", "data": data}))

    # ================================================================== admin

    async def _list_workers(self, request: HttpRequest) -> None:
        rejected = self._discovery.rejected if self._discovery is not None else []
        body = {
            "workers": [w.describe() for w in self.registry.workers],
            "rejected": [dataclasses.asdict(r) for r in rejected],
        }
        request.respond(200, JSON_HEADERS, orjson.dumps(body))

    def _admin_args(self, request: HttpRequest) -> dict[str, Any]:
        args: dict[str, Any] = {k: v[-1] for k, v in parse_qs(request.query).items()}
        if request.body:
            body = parse_json_object(request.body)
            args.update(body)
        return args

    async def _add_worker(self, request: HttpRequest) -> None:
        try:
            args = self._admin_args(request)
            url = args.get("url")
            if not isinstance(url, str) or not url:
                raise ClientError(
                    400, "url is required: the worker's http://HOST:PORT", param="url"
                )
            for key in ("kv_events_endpoint", "kv_replay_endpoint"):
                if args.get(key) is not None and not isinstance(args[key], str):
                    raise ClientError(
                        400, f"{key} must be a string like tcp://HOST:PORT", param=key
                    )
            spec = WorkerSpec(url, args.get("kv_events_endpoint"), args.get("kv_replay_endpoint"))
            self._check_dialable(spec)
            worker = self.registry.add(spec, manual=True)
        except InvalidWorkerURL as err:
            self._reply_error(request, ClientError(400, str(err), param="url"), "admin")
            return
        except ClientError as err:
            self._reply_error(request, err, "admin")
            return
        request.respond(200, JSON_HEADERS, orjson.dumps({"worker": worker.describe()}))

    def _check_dialable(self, spec: WorkerSpec) -> None:
        """Refuse (400) a worker or KV-event endpoint outside ``--worker-networks``."""
        problem = url_problem(spec.url, self.networks)
        if problem:
            raise ClientError(400, problem, param="url")
        for key, endpoint in (
            ("kv_events_endpoint", spec.kv_events_endpoint),
            ("kv_replay_endpoint", spec.kv_replay_endpoint),
        ):
            problem = endpoint_problem(endpoint, self.networks) if endpoint else None
            if problem:
                raise ClientError(400, problem, param=key)

    async def _remove_worker(self, request: HttpRequest) -> None:
        try:
            args = self._admin_args(request)
            url = args.get("url")
            if not isinstance(url, str) or not url:
                raise ClientError(
                    400, "url is required: the worker's http://HOST:PORT", param="url"
                )
            from tpuserve_router.workers import normalize_worker_url

            name = normalize_worker_url(url)[0]
        except InvalidWorkerURL as err:
            self._reply_error(request, ClientError(400, str(err), param="url"), "admin")
            return
        except ClientError as err:
            self._reply_error(request, err, "admin")
            return
        if self.registry.remove(name) is None:
            known = ", ".join(self.registry.names()) or "none"
            self._reply_error(
                request,
                ClientError(
                    404,
                    f"worker {name} is not registered; registered: {known}",
                    param="url",
                    error_type="not_found_error",
                ),
                "admin",
            )
            return
        request.respond(200, JSON_HEADERS, orjson.dumps({"removed": name}))

    async def _flush_cache(self, request: HttpRequest) -> None:
        session = self.health.session
        workers = list(self.registry.workers)
        results: dict[str, Any] = {}

        async def flush(worker: Worker) -> None:
            try:
                assert session is not None
                async with session.post(worker.name + "/flush_cache") as response:
                    text = await response.text()
                    results[worker.name] = {"status": response.status, "message": text.strip()}
                    if response.status == 200:
                        self.policy.on_worker_reset(worker.name)
            except Exception as err:
                results[worker.name] = {"status": None, "message": str(err) or type(err).__name__}

        await asyncio.gather(*(flush(w) for w in workers))
        ok = all(r["status"] == 200 for r in results.values())
        request.respond(
            200 if ok else 502, JSON_HEADERS, orjson.dumps({"flushed": ok, "workers": results})
        )

    # ================================================================== state for metrics

    def _worker_states(self) -> list[WorkerState]:
        return [
            WorkerState(w.name, w.models, w.healthy, w.in_flight) for w in self.registry.workers
        ]

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _other_healthy(worker: Worker, workers: list[Worker]) -> bool:
    return any(w.healthy and w is not worker for w in workers)


def _forwarded_headers(request: HttpRequest) -> bytes:
    return b"".join(
        name + b": " + value + b"\r\n" for name, value in request.headers if name not in HOP_BY_HOP
    )


def _upstream_request(request: HttpRequest, host: bytes, forwarded: bytes) -> bytes:
    target = request.path.encode("latin-1")
    if request.query:
        target += b"?" + request.query.encode("latin-1")
    body = request.body
    return b"".join(
        (
            request.method, b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n", forwarded,
            b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body,
        )
    )  # fmt: skip


def _response_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Upstream response headers to pass on (names arrive lower-cased from the proxy)."""
    return b"".join(
        name + b": " + value + b"\r\n" for name, value in headers if name not in HOP_BY_HOP
    )


def _is_chunked(upstream: UpstreamConnection) -> bool:
    value = upstream.header(b"transfer-encoding")
    return value is not None and b"chunked" in value.lower()


def _dialable(endpoint: str, host: str) -> str:
    """A ZMQ endpoint the router can connect to: wildcard hosts become the worker's host."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "tcp":
        return endpoint
    address, _, port = rest.rpartition(":")
    if address in ("*", "0.0.0.0", "::", "[::]", ""):
        shown = f"[{host}]" if ":" in host else host
        return f"tcp://{shown}:{port}"
    return endpoint


def _current_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return "default"
