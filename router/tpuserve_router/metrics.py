"""Every ``tpuserve_router_*`` series, declared here once and spelled as on ``/metrics``.

Dashboards, alerts and recording rules refer to these names; a search from a panel lands
here. The request hot path must stay cheap (the router's CPU per request is a benchmarked
target), so series are kept in plain Python numbers: `Counter`, `Histogram` and `Gauge`
(`tpuserve_router.series`) mirror client_python's ``labels(...).inc()/observe()/set()``
interface, but a child is a bare value with no lock (the router is one event loop), and
``labels(...)`` is one dict lookup: a family keeps its children, made on first use, and is
their only cache (so `remove_worker_series` leaves no stale copy behind). One client_python
collector exposes them all at scrape time, in the standard text format, through a normal
`CollectorRegistry`. Gauges that mirror state (in-flight, health, index size) are computed
at scrape time by `StateCollector`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sglang_tpu.kv_events import DECODE_ERROR_REASONS
from tpuserve_router.labels import (
    ABORT_REASONS,
    EJECTION_REASONS,
    FAILOVER_ROUTES,
    KV_TIERS,
    OUTCOMES,
    PEER_MESSAGE_KINDS,
)
from tpuserve_router.series import Counter, Gauge, Histogram, Series, SeriesCollector

# Seconds; TTFT on TPU ranges from tens of ms (cached prefix) to tens of seconds (queues).
TTFT_BUCKETS_SECONDS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""2.0 is the TTFT SLO's bound (`tpuserve.observability.rule_basis.TTFT_SLO_SECONDS`): the SLO's
good ratio of an engine without SGLang's histogram reads this one."""
E2E_BUCKETS_SECONDS: Final = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
# Seconds a request waits for a slice to come up from zero: a TPU cold start takes minutes.
HOLD_BUCKETS_SECONDS: Final = (
    0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)  # fmt: skip
HOLD_OUTCOMES: Final = (
    "dispatched", "queue_full", "preempted", "timeout", "client_gone", "shutdown",
)  # fmt: skip
DEMAND_RESULTS: Final = ("ok", "failed")
RATIO_BUCKETS: Final = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

UPSTREAM_ERROR_REASONS: Final = (
    "connect_error",  # refused, unreachable, connect timeout
    "reset_before_response",  # the connection closed before the response started
    "retryable_status",  # 429 or 5xx before anything reached the client: retried
    "server_error",  # a 5xx answer passed on to the client
    "first_byte_timeout",  # no answer within the time derived for the request
    "stream_broken",  # the connection broke after the response started, or sent past its end
    "stream_stalled",  # a started answer sent nothing for --stream-idle-timeout
    "request_timeout",
    "response_too_large",  # over --max-response-bytes (or a head over --max-header-bytes)
    "worker_down",  # in flight when the worker failed its health checks
)
PICKER_STREAM_REFUSAL_REASONS: Final = (
    "unauthenticated",  # no (or the wrong) token, with --picker-token-file
    "protocol",  # a message out of turn: headers twice, a body after the pick, ...
    "headers_too_large",  # over Envoy's 60 KiB of headers
    "header_timeout",  # the request headers did not arrive in time
    "body_timeout",  # the request body did not end in time
    "first_byte_timeout",  # no answer within --first-byte-timeout after the pick
    "idle_timeout",  # no next part of the answer within --stream-idle-timeout
)
"""Why the endpoint picker ended a stream with a gRPC status (picker.py)."""
PICKER_CONNECTION_REFUSAL_REASONS: Final = (
    "per_address",  # its address holds --picker-max-connections-per-address unauthenticated
    "full",  # --picker-max-connections reached (the oldest unauthenticated one is closed)
)
"""Why the endpoint picker's gate closed a connection (picker_gate.py)."""
CONNECTION_CLOSE_REASONS: Final = (
    "header_timeout",  # a head (or a new connection's first request) did not arrive in time
    "body_timeout",
    "keep_alive_timeout",  # idle between requests
    "send_timeout",  # the client stopped reading its response
    "evicted",  # closed while waiting, to make room at the connection limit
    "refused",  # over the connection limit with every connection busy: 503
    "malformed",  # 400: not HTTP/1.1
    "url_too_long",  # 414
    "head_too_large",  # 431
    "too_many_headers",  # 431
    "body_too_large",  # 413
    "unauthorized",  # refused at the end of the head (401, 403; 400 for two credentials)
    "unexpected_body",  # a body on a route that takes none: 404, 405, 400 at the head
    "buffer_budget",  # 503: the body does not fit in --max-buffered-bytes
    "linger_cut",  # a refused client still sending, slower than the lingering close's rate
    "linger_quiet",  # a refused client that sent nothing for 30 s: its answer had its time
)
AUTH_FAILURE_REASONS: Final = ("missing", "invalid", "admin_denied")
KV_EVENT_TYPES: Final = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
RESYNC_REASONS: Final = (
    "gap_unrecoverable",  # lost batches the engine could not replay
    "engine_restart",  # sequence numbers went back
    "publisher_disconnected",  # the engine's PUB socket went away
    "all_blocks_cleared",  # the engine flushed its cache
)
REPLAY_RESULTS: Final = ("ok", "failed")
KV_EVENT_SKIP_REASONS: Final = DECODE_ERROR_REASONS  # bad_frames, ..., unknown_event
INDEX_KINDS: Final = (
    "tree_chars",
    "confirmed_blocks",
    "predicted_blocks",
    "successor_keys",
    "shared_prefix_ends",
    "token_cache_bytes",
)


@dataclass(frozen=True)
class RouterMetrics:
    registry: CollectorRegistry
    info: Gauge
    requests: Counter
    ttft: Histogram
    e2e: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter
    cached_tokens: Counter
    predicted_cached_tokens: Counter
    predicted_cached_tokens_by_tier: Counter
    decisions: Counter
    prefix_match_ratio: Histogram
    retries: Counter
    migrations: Counter
    retries_over_budget: Counter
    upstream_errors: Counter
    worker_ejections: Counter
    upstream_aborts: Counter
    tenant_requests: Counter
    tenant_tokens: Counter
    rate_limited: Counter
    shed: Counter
    held_requests: Gauge
    hold_seconds: Histogram
    hold_outcomes: Counter
    demand_signals: Counter
    auth_failures: Counter
    api_key_reloads: Counter
    api_keys: Gauge
    connections_closed: Counter
    picker_streams_refused: Counter
    picker_connections_refused: Counter
    kv_events: Counter
    kv_event_gaps: Counter
    kv_event_resyncs: Counter
    kv_event_replays: Counter
    kv_event_lag: Gauge
    kv_events_skipped: Counter
    workers_changed: Counter
    peers: Gauge
    peer_messages: Counter
    pd_requests: Counter
    pd_failures: Counter
    pd_ttft: Histogram
    pd_prefill: Histogram
    pd_kv_transfer: Histogram


def create_router_metrics(registry: CollectorRegistry) -> RouterMetrics:
    """Declare every router series in ``registry`` (tests pass a fresh one)."""
    metrics = RouterMetrics(
        registry=registry,
        info=Gauge(
            "tpuserve_router_info",
            "Always 1; labels carry the routing policy and the router version.",
            ["policy", "version"],
        ),
        requests=Counter(
            "tpuserve_router_requests_total",
            "Requests the router answered, by model, worker, route and HTTP status "
            "(worker is 'none' when none was chosen: bad input, unknown model, no worker).",
            ["model", "worker", "route", "status"],
        ),
        ttft=Histogram(
            "tpuserve_router_ttft_seconds",
            "Seconds from a streamed request's arrival to its first body chunk from the worker.",
            ["model"],
            TTFT_BUCKETS_SECONDS,
        ),
        e2e=Histogram(
            "tpuserve_router_e2e_latency_seconds",
            "Seconds from a request's arrival to the end of its response, as the router saw it.",
            ["model", "route"],
            E2E_BUCKETS_SECONDS,
        ),
        prompt_tokens=Counter(
            "tpuserve_router_prompt_tokens_total",
            "Prompt tokens of finished requests, from the responses' usage.",
            ["model", "worker"],
        ),
        completion_tokens=Counter(
            "tpuserve_router_completion_tokens_total",
            "Completion tokens of finished requests, from the responses' usage.",
            ["model", "worker"],
        ),
        cached_tokens=Counter(
            "tpuserve_router_cached_tokens_total",
            "Prompt tokens the worker served from its prefix cache (usage cached_tokens).",
            ["model", "worker"],
        ),
        predicted_cached_tokens=Counter(
            "tpuserve_router_predicted_cached_tokens_total",
            "Prompt tokens the routing policy predicted the worker had cached; compare with "
            "tpuserve_router_cached_tokens_total (the gap is routing regret).",
            ["model", "worker"],
        ),
        predicted_cached_tokens_by_tier=Counter(
            "tpuserve_router_predicted_cached_tokens_by_tier_total",
            "Prompt tokens the routing policy predicted the chosen worker had cached, by the "
            "tier holding them: hbm, or host (an engine's host-memory KV tier, loaded back "
            "before prefill).",
            ["policy", "tier"],
        ),
        decisions=Counter(
            "tpuserve_router_routing_decisions_total",
            "Routing decisions by policy and outcome: prefix_hit, miss, balanced_away "
            "(load imbalance sent it away from the prefix holder), load_only.",
            ["policy", "outcome"],
        ),
        prefix_match_ratio=Histogram(
            "tpuserve_router_prefix_match_ratio",
            "Share of the prompt cached on the chosen worker: source=predicted (by the "
            "policy) or actual (cached_tokens / prompt_tokens from the response).",
            ["policy", "source"],
            RATIO_BUCKETS,
        ),
        retries=Counter(
            "tpuserve_router_retries_total",
            "Requests re-sent to another worker after a failure before the first byte.",
            ["route"],
        ),
        migrations=Counter(
            "tpuserve_router_stream_migrations_total",
            "Streams whose engine died mid-answer: continued on another engine (migrated), or "
            "ended with an error event saying why not (not_migrated).",
            ["route", "result"],
        ),
        retries_over_budget=Counter(
            "tpuserve_router_retries_over_budget_total",
            "Retries not made because the retry budget was spent (--retry-budget-percent).",
            [],
        ),
        upstream_errors=Counter(
            "tpuserve_router_upstream_errors_total",
            "Failures talking to a worker, by reason.",
            ["worker", "reason"],
        ),
        upstream_aborts=Counter(
            "tpuserve_router_upstream_aborts_total",
            "Requests a worker was asked to abort (/abort_request), by reason: client_gone "
            "(the client left or stopped reading), gave_up (timeout, stall, oversized answer).",
            ["worker", "reason"],
        ),
        tenant_requests=Counter(
            "tpuserve_router_tenant_requests_total",
            "Requests of API keys answered by a worker, by key (its key id: the first 12 hex "
            "digits of its SHA-256, never the tenant; at most 100, the rest 'other'), priority "
            "class and HTTP status.",
            ["key", "priority", "status"],
        ),
        tenant_tokens=Counter(
            "tpuserve_router_tenant_tokens_total",
            "Tokens API keys' requests were charged, each once as it ended (never negative), "
            "by key (its key id) and kind (prompt, completion).",
            ["key", "kind"],
        ),
        rate_limited=Counter(
            "tpuserve_router_rate_limited_total",
            "Requests refused with 429, by key (its key id) and limit (requests, tokens).",
            ["key", "limit"],
        ),
        shed=Counter(
            "tpuserve_router_shed_total",
            "Requests refused with 503 under overload, by priority class (lowest shed first).",
            ["priority"],
        ),
        held_requests=Gauge(
            "tpuserve_router_held_requests",
            "Requests waiting in the hold queue for a routable worker of their model "
            "(scale from zero), by model (`other` for a model the router does not know yet).",
            ["model"],
        ),
        hold_seconds=Histogram(
            "tpuserve_router_hold_seconds",
            "Seconds a request waited in the hold queue, whatever its outcome.",
            ["model"],
            buckets=HOLD_BUCKETS_SECONDS,
        ),
        hold_outcomes=Counter(
            "tpuserve_router_hold_outcomes_total",
            "Requests that entered or were refused by the hold queue, by outcome: "
            "dispatched; queue_full, preempted (its place taken by a more important "
            "request), timeout and shutdown (503 with Retry-After); client_gone.",
            ["model", "outcome"],
        ),
        demand_signals=Counter(
            "tpuserve_router_demand_signals_total",
            "Writes of the demand Lease the operator scales from zero on, by result (ok, failed).",
            ["result"],
        ),
        auth_failures=Counter(
            "tpuserve_router_auth_failures_total",
            "Requests refused with 401 (missing or invalid API key) or 403 (admin API).",
            ["reason"],
        ),
        api_key_reloads=Counter(
            "tpuserve_router_api_key_reloads_total",
            "Reloads of the API keys file after it changed, by result (ok, failed: the keys "
            "in force stay).",
            ["result"],
        ),
        api_keys=Gauge(
            "tpuserve_router_api_keys",
            "API keys in force.",
            [],
        ),
        worker_ejections=Counter(
            "tpuserve_router_worker_ejections_total",
            "Times a worker was ejected as an outlier, by the rule that ejected it "
            "(consecutive_failures, failure_rate).",
            ["worker", "reason"],
        ),
        connections_closed=Counter(
            "tpuserve_router_connections_closed_total",
            "Client connections the router closed itself, by reason (timeouts, limits, "
            "malformed requests, eviction at the connection limit).",
            ["reason"],
        ),
        picker_streams_refused=Counter(
            "tpuserve_router_picker_streams_refused_total",
            "Endpoint-picker streams the router ended with a gRPC status instead of an answer, "
            "by reason (unauthenticated, protocol, headers_too_large, and the timeouts).",
            ["reason"],
        ),
        picker_connections_refused=Counter(
            "tpuserve_router_picker_connections_refused_total",
            "Endpoint-picker connections the router closed at its connection caps, by reason "
            "(per_address: the address's unauthenticated connections; full: the port's cap).",
            ["reason"],
        ),
        kv_events=Counter(
            "tpuserve_router_kv_events_total",
            "KV-cache events received from workers, by type.",
            ["worker", "type"],
        ),
        kv_event_gaps=Counter(
            "tpuserve_router_kv_event_gaps_total",
            "Gaps in a worker's KV-event sequence numbers (lost batches).",
            ["worker"],
        ),
        kv_event_resyncs=Counter(
            "tpuserve_router_kv_event_resyncs_total",
            "Times the router dropped everything it knew about a worker's cache, by reason.",
            ["worker", "reason"],
        ),
        kv_event_replays=Counter(
            "tpuserve_router_kv_event_replays_total",
            "Replays requested after a gap, by result (ok or failed).",
            ["worker", "result"],
        ),
        kv_event_lag=Gauge(
            "tpuserve_router_kv_event_lag_batches",
            "KV-event batches a worker published that its block index knows it has not "
            "applied yet (a gap or a replay still being asked for); 0 when caught up.",
            ["worker"],
        ),
        kv_events_skipped=Counter(
            "tpuserve_router_kv_events_skipped_total",
            "KV-event messages or events from a worker the router could not use and skipped, "
            "by reason: bad_frames, undecodable_batch, malformed_event, unknown_event.",
            ["worker", "reason"],
        ),
        workers_changed=Counter(
            "tpuserve_router_worker_changes_total",
            "Workers added or removed (by discovery or the admin API), by change.",
            ["change"],
        ),
        peers=Gauge(
            "tpuserve_router_peers",
            "Peer router replicas this router is connected to (--peer-port: --peer, "
            "--peers-from-dns), itself not counted.",
            [],
        ),
        peer_messages=Counter(
            "tpuserve_router_peer_messages_total",
            "Messages received from peer router replicas, by kind: route, first_byte, end, "
            "hello, malformed (unreadable: skipped).",
            ["kind"],
        ),
        pd_requests=Counter(
            "tpuserve_router_pd_requests_total",
            "Requests in PD mode by how they were served: disaggregated (a prefill/decode "
            "pair), colocated (the uncached prompt was under the threshold), no_prefill (no "
            "healthy pair: a colocated worker took it).",
            ["how"],
        ),
        pd_failures=Counter(
            "tpuserve_router_pd_failures_total",
            "Failed legs of prefill/decode pairs, by the leg blamed (a decode that never got "
            "its KV blames the prefill) and kind: bootstrap, transfer, transport, status, "
            "timeout.",
            ["leg", "kind"],
        ),
        pd_ttft=Histogram(
            "tpuserve_router_pd_ttft_seconds",
            "Seconds from dispatching a pair to the decode's first body chunk (a stream) or its "
            "whole answer: queue, prefill, KV transfer and the first decode step.",
            ["model"],
            TTFT_BUCKETS_SECONDS,
        ),
        pd_prefill=Histogram(
            "tpuserve_router_pd_prefill_seconds",
            "Seconds from dispatching a pair to the prefill's answer, which SGLang sends once "
            "the KV is sent: queue, prefill, bootstrap wait and transfer.",
            [],
            TTFT_BUCKETS_SECONDS,
        ),
        pd_kv_transfer=Histogram(
            "tpuserve_router_pd_kv_transfer_seconds",
            "Seconds between a prefill engine's first token and its answer (bootstrap wait and "
            "KV send), from its /generate answer's meta_info; other routes do not report it.",
            [],
            TTFT_BUCKETS_SECONDS,
        ),
    )
    series: list[Series[Any]] = [v for v in vars(metrics).values() if isinstance(v, Series)]
    registry.register(SeriesCollector(series))
    return metrics


@dataclass(frozen=True)
class WorkerState:
    """A worker as the state gauges show it at scrape time."""

    name: str
    models: tuple[str, ...]
    healthy: bool
    in_flight: int
    engine_type: str = "auto"
    engine_load: Any = None  # `engines.engine_types.EngineLoad` of its last load poll


class StateCollector(Collector):
    """Gauges that mirror the router's state, computed at scrape time (free on the hot path).

    - ``tpuserve_router_in_flight_requests{worker}``
    - ``tpuserve_router_worker_healthy{model,worker}``
    - ``tpuserve_router_worker_engine_requests{worker,state}`` and
      ``tpuserve_router_worker_kv_usage{worker}``: the engine's own counts as its last load
      poll read them (SGLang's ``/v1/loads``, SGLang-JAX's ``/get_server_info``), so an engine
      without ``sglang:*`` series still shows its queue and KV pool
    - ``tpuserve_router_worker_engine_info{worker,engine_type}`` (1)
    - ``tpuserve_router_prefix_index_size{kind}``
    - ``tpuserve_router_client_connections`` (open on the client port)
    - ``tpuserve_router_buffered_request_bytes`` (request bodies held, `--max-buffered-bytes`)
    - ``tpuserve_router_failover_routes_total{kind}``: the policy's own counts
    """

    def __init__(
        self,
        workers: Callable[[], Iterable[WorkerState]],
        index_size: Callable[[], dict[str, int]],
        connections: Callable[[], int] = lambda: 0,
        buffered: Callable[[], int] = lambda: 0,
        failover_routes: Callable[[], dict[str, int]] = dict,
    ) -> None:
        self._workers = workers
        self._index_size = index_size
        self._connections = connections
        self._buffered = buffered
        self._failover_routes = failover_routes

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "tpuserve_router_in_flight_requests",
            "Requests sent to the worker that have not finished.",
            labels=["worker"],
        )
        healthy = GaugeMetricFamily(
            "tpuserve_router_worker_healthy",
            "1 if the worker is routable (health checks pass, not ejected as an outlier), else 0.",
            labels=["model", "worker"],
        )
        requests = GaugeMetricFamily(
            "tpuserve_router_worker_engine_requests",
            "Requests the worker's engine holds, running or waiting, as its last load poll "
            "read them (all router replicas' and other clients' requests).",
            labels=["worker", "state"],
        )
        kv_usage = GaugeMetricFamily(
            "tpuserve_router_worker_kv_usage",
            "Share of the worker's KV pool in use (its most loaded DP rank), as its last load "
            "poll read it.",
            labels=["worker"],
        )
        engine_info = GaugeMetricFamily(
            "tpuserve_router_worker_engine_info",
            "Always 1; engine_type is the engine the router takes the worker for (sglang, "
            "sglang-jax, or auto while not known).",
            labels=["worker", "engine_type"],
        )
        for worker in self._workers():
            in_flight.add_metric([worker.name], worker.in_flight)
            for model in worker.models or ("",):
                healthy.add_metric([model, worker.name], 1.0 if worker.healthy else 0.0)
            engine_info.add_metric([worker.name, worker.engine_type], 1.0)
            load = worker.engine_load
            if load is not None:
                requests.add_metric([worker.name, "running"], load.running)
                requests.add_metric([worker.name, "waiting"], load.waiting)
                if load.kv_usage is not None:
                    kv_usage.add_metric([worker.name], load.kv_usage)
        index = GaugeMetricFamily(
            "tpuserve_router_prefix_index_size",
            "Size of the routing state: tree_chars (cache_aware), confirmed_blocks and "
            "predicted_blocks (precise, cost), successor_keys (lost workers' block keys "
            "remembered, precise), shared_prefix_ends (precise), token_cache_bytes (the token "
            "policies' token cache).",
            labels=["kind"],
        )
        sizes = self._index_size()
        for kind in INDEX_KINDS:
            index.add_metric([kind], sizes.get(kind, 0))
        connections = GaugeMetricFamily(
            "tpuserve_router_client_connections",
            "Client connections open on the router's port.",
            value=self._connections(),
        )
        buffered = GaugeMetricFamily(
            "tpuserve_router_buffered_request_bytes",
            "Bytes of request bodies the router holds (being read, in flight or held); "
            "bounded by --max-buffered-bytes.",
            value=self._buffered(),
        )
        yield in_flight
        yield healthy
        yield requests
        yield kv_usage
        yield engine_info
        yield index
        failover = CounterMetricFamily(
            "tpuserve_router_failover_routes",
            "Requests the routing policy sent by its failover rules: successor (a prompt a "
            "lost worker held, to its successor), shared_prefix_spread (a hit on a shared "
            "prefix, away from its busy holder).",
            labels=["kind"],
        )
        routes = self._failover_routes()
        for kind in FAILOVER_ROUTES:
            failover.add_metric([kind], routes.get(kind, 0))
        yield connections
        yield buffered
        yield failover

    def describe(self) -> Iterator[Metric]:
        return iter(())


def remove_worker_series(metrics: RouterMetrics, worker: str) -> None:
    """Drop a departed worker's series so dashboards stop showing it."""
    per_worker: tuple[Series[Any], ...] = (
        metrics.requests,
        metrics.prompt_tokens,
        metrics.completion_tokens,
        metrics.cached_tokens,
        metrics.predicted_cached_tokens,
        metrics.upstream_errors,
        metrics.worker_ejections,
        metrics.upstream_aborts,
        metrics.kv_events,
        metrics.kv_event_gaps,
        metrics.kv_event_resyncs,
        metrics.kv_event_replays,
        metrics.kv_event_lag,
        metrics.kv_events_skipped,
    )
    for metric in per_worker:
        metric.remove_by_labels({"worker": worker})


def touch_worker_series(metrics: RouterMetrics, worker: str, *, kv_events: bool) -> None:
    """Create a new worker's error and KV-event series at zero.

    A series that first appears at its first increment has no earlier sample, so
    ``increase()`` and ``rate()`` cannot see that increment: the first upstream error or the
    first KV-event gap after a worker joins would be lost to alerts. The KV-event series are
    created only when the router subscribes to KV events. `remove_worker_series` drops them
    all when the worker leaves.
    """
    for reason in UPSTREAM_ERROR_REASONS:
        metrics.upstream_errors.labels(worker, reason)
    for reason in EJECTION_REASONS:
        metrics.worker_ejections.labels(worker, reason)
    for reason in ABORT_REASONS:
        metrics.upstream_aborts.labels(worker, reason)
    if not kv_events:
        return
    for event_type in KV_EVENT_TYPES:
        metrics.kv_events.labels(worker, event_type)
    metrics.kv_event_gaps.labels(worker)
    for reason in RESYNC_REASONS:
        metrics.kv_event_resyncs.labels(worker, reason)
    for result in REPLAY_RESULTS:
        metrics.kv_event_replays.labels(worker, result)
    metrics.kv_event_lag.labels(worker)
    for reason in KV_EVENT_SKIP_REASONS:
        metrics.kv_events_skipped.labels(worker, reason)


def touch_token_series(metrics: RouterMetrics, model: str, worker: str) -> None:
    """Create a worker's token series for ``model`` at zero, before its first answer."""
    for series in (
        metrics.prompt_tokens,
        metrics.completion_tokens,
        metrics.cached_tokens,
        metrics.predicted_cached_tokens,
    ):
        series.labels(model, worker)


def touch_known_series(metrics: RouterMetrics, policy: str) -> None:
    """Create series that should exist at zero from the start (client_python's advice)."""
    for outcome in OUTCOMES:
        metrics.decisions.labels(policy, outcome)
    for tier in KV_TIERS:
        metrics.predicted_cached_tokens_by_tier.labels(policy, tier)
    for reason in CONNECTION_CLOSE_REASONS:
        metrics.connections_closed.labels(reason)
    metrics.retries_over_budget.labels()
    for reason in AUTH_FAILURE_REASONS:
        metrics.auth_failures.labels(reason)
    for result in DEMAND_RESULTS:
        metrics.demand_signals.labels(result)
    metrics.peers.labels()
    for kind in PEER_MESSAGE_KINDS:
        metrics.peer_messages.labels(kind)
