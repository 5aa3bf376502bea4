"""`tpuserve router`: the prefix-aware router in front of SGLang-compatible workers.

Every flag falls back to an environment variable ``TPUSERVE_ROUTER_<FLAG>`` (upper case,
dashes as underscores; e.g. ``TPUSERVE_ROUTER_PORT``, ``TPUSERVE_ROUTER_WORKERS`` as a
comma-separated list), so a Deployment can set either. A flag and its variable obey the same
rule (`sglang_tpu.cli_types` for numbers); an empty variable for a number or a switch counts
as unset. Settings are checked once at start; every problem is reported with the setting,
its value and what is allowed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_tpu import cli_types
from sglang_tpu.disaggregation import DEFAULT_BOOTSTRAP_PORT
from tpuserve_router.config import (
    ADMIN_MODES,
    DEFAULT_LEADER_LABEL,
    DEFAULT_MODEL_LABEL,
    DEFAULT_POLICY,
    DEFAULT_WORKER_URL_ANNOTATION,
    DISCOVERY_MODES,
    ENGINE_TYPES,
    PD_POLICIES,
    ConfigError,
    RouterConfig,
    parse_key_values,
)
from tpuserve_router.policies.base import registered_policy_names
from tpuserve_router.validation import validate

DESCRIPTION = """Run the prefix-aware router: OpenAI and SGLang APIs in front of the workers.

Workers are engine leaders speaking SGLang's HTTP API (real SGLang, `tpuserve engine sim`,
or any compatible server): a static list (--worker URL ...) or the ready leader pods of a
Kubernetes label selector (--discovery kubernetes --selector k=v). Every flag can also be
set with the environment variable TPUSERVE_ROUTER_<FLAG> (e.g. TPUSERVE_ROUTER_POLICY).

examples:
  tpuserve router --port 8000 --worker http://127.0.0.1:30001 --worker http://127.0.0.1:30002
  tpuserve router --port 8000 --discovery kubernetes --namespace serving \\
      --selector app.kubernetes.io/instance=llama --policy cache_aware
"""

ENV_PREFIX = "TPUSERVE_ROUTER_"


@dataclass(frozen=True)
class Option:
    flag: str
    field: str
    kind: Callable[[str], Any]
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # --FLAG / --no-FLAG (its environment variable: true, false or auto)


def _auto_bool(text: str) -> bool | None:
    """A switch's environment value: true or false, or auto (None: the router decides)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("auto", ""):
        return None
    raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: true, false or auto")


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


DEFAULTS = RouterConfig()

OPTIONS: tuple[Option, ...] = (
    Option("--host", "host", str, f"Address to listen on (default {DEFAULTS.host})."),
    Option(
        "--port",
        "port",
        cli_types.port,
        f"Port to listen on; 0 = a free port (default {DEFAULTS.port}).",
    ),
    Option(
        "--uds",
        "uds",
        str,
        "Listen on this unix socket instead of --host/--port (a sidecar's clients, a machine "
        "without TCP); the file is made with mode 0660 and replaces a stale socket there.",
        metavar="PATH",
    ),
    Option(
        "--metrics-port",
        "metrics_port",
        cli_types.port,
        "Also serve /metrics on this port (it is always served on --port).",
    ),
    Option(
        "--discovery",
        "discovery",
        str,
        "Where workers come from (default static).",
        choices=DISCOVERY_MODES,
    ),
    Option("--namespace", "namespace", str, "Kubernetes namespace to watch (default: the pod's)."),
    Option(
        "--selector",
        "selector",
        str,
        "Kubernetes label selector of the model-server pods, k=v[,k=v].",
        metavar="K=V[,K=V]",
    ),
    Option(
        "--leader-label",
        "leader_label",
        str,
        f"Only pods with this label are routable (default {DEFAULT_LEADER_LABEL}; empty: any).",
        metavar="K=V",
    ),
    Option(
        "--worker-port",
        "worker_port",
        cli_types.nonzero_port,
        "Workers' HTTP port for discovered pods (default: the pod's TPUSERVE_HTTP_PORT, its "
        "container port named http, else 30000).",
    ),
    Option(
        "--model-label",
        "model_label",
        str,
        "Pod label naming the served model a discovered worker belongs to (default "
        f"{DEFAULT_MODEL_LABEL}; empty, or a pod without it: read from its /v1/models).",
        metavar="KEY",
    ),
    Option(
        "--worker-url-annotation",
        "worker_url_annotation",
        str,
        f"Pod annotation that overrides a worker's URL (default {DEFAULT_WORKER_URL_ANNOTATION}).",
    ),
    Option(
        "--worker-networks",
        "worker_networks",
        _comma_list,
        "Only dial workers (and KV-event endpoints) at IPs in these networks; discovered pods "
        "outside them are not routed and are listed under `rejected` by GET /workers "
        "(default: any address; a KV-event endpoint a worker's /server_info names only at its "
        "own host or in loopback and private ranges).",
        metavar="CIDR[,CIDR]",
    ),
    Option(
        "--policy",
        "policy",
        str,
        f"Routing policy (default {DEFAULT_POLICY}).",
        choices=tuple(registered_policy_names()),
    ),
    Option(
        "--kv-events",
        "kv_events",
        _auto_bool,
        "Subscribe to the workers' KV-cache events (endpoints from each worker's "
        "/server_info unless a pod annotation gives them), or not (--no-kv-events). "
        "Default: when the policy uses them (precise, cost).",
        switch=True,
    ),
    Option(
        "--engine-type",
        "engine_type",
        str,
        "The engine the workers run: sglang (load from /v1/loads, KV events), sglang-jax "
        "(SGLang-JAX: load from /get_server_info's internal states, no KV events, approximate "
        "prefix routing) or auto (default: each worker's detected, SGLang-JAX when it has no "
        "/v1/loads and its /get_server_info shows SGLang-JAX's internal states).",
        choices=ENGINE_TYPES,
    ),
    Option(
        "--kv-snapshot-from",
        "kv_snapshot_from",
        str,
        "A peer router's URL (http://HOST:PORT, e.g. the router Service): start the block "
        "index from its GET /kv_snapshot, then replay the engines' KV events from there, so a "
        "replica started after the engines' replay buffers wrapped still knows what they hold.",
    ),
    Option(
        "--kv-snapshot-key-file",
        "kv_snapshot_key_file",
        str,
        "A file holding an admin API key of the peer (e.g. a mounted Secret), sent with the "
        "--kv-snapshot-from request: the peer's admin API answers other hosts only with one.",
        metavar="PATH",
    ),
    Option(
        "--kv-snapshot-timeout",
        "kv_snapshot_timeout_seconds",
        cli_types.duration_seconds,
        "Seconds a start waits for a KV snapshot (from --kv-snapshot-from, or from all peers "
        "at once over peering, the first readable one taken) before going on without it "
        f"(default {DEFAULTS.kv_snapshot_timeout_seconds:g}).",
    ),
    Option(
        "--kv-snapshot-max-bytes",
        "kv_snapshot_max_bytes",
        cli_types.positive_int,
        "The largest KV snapshot taken from a peer (1024 to 4 GiB); a larger one is refused "
        f"(default {DEFAULTS.kv_snapshot_max_bytes}).",
    ),
    Option(
        "--token-cache-bytes",
        "token_cache_bytes",
        cli_types.positive_int,
        "Memory the cache of prompts' token ids may take, in bytes (at least 1 MiB; precise "
        f"and cost) (default {DEFAULTS.token_cache_bytes}).",
    ),
    Option(
        "--tokenizer",
        "tokenizer",
        str,
        "tokenizer.json the engines use (precise and cost tokenize prompts); default: the "
        "built-in tokenizer of the engine twin.",
    ),
    Option(
        "--max-request-line-bytes",
        "max_request_line_bytes",
        cli_types.positive_int,
        f"Longer request URLs get 414 (default {DEFAULTS.max_request_line_bytes}).",
    ),
    Option(
        "--max-header-bytes",
        "max_header_bytes",
        cli_types.positive_int,
        "Larger request heads (request line and headers) get 431 "
        f"(default {DEFAULTS.max_header_bytes}).",
    ),
    Option(
        "--max-headers",
        "max_headers",
        cli_types.positive_int,
        f"Requests with more headers get 431 (default {DEFAULTS.max_headers}).",
    ),
    Option(
        "--max-request-bytes",
        "max_request_bytes",
        cli_types.positive_int,
        f"Larger request bodies get 413 (default {DEFAULTS.max_request_bytes}).",
    ),
    Option(
        "--max-buffered-bytes",
        "max_buffered_bytes",
        cli_types.positive_int,
        "Request bodies the router holds at once, in all (requests being read, in flight or "
        "held); a body that does not fit gets 503 with Retry-After, and held requests may take "
        f"at most half (default {DEFAULTS.max_buffered_bytes}).",
    ),
    Option(
        "--max-buffered-bytes-per-client",
        "max_buffered_bytes_per_client",
        cli_types.positive_int,
        "Of --max-buffered-bytes, what one client may hold at once: an API key's tenant, or "
        "without keys a client address (every client behind one proxy address shares it); "
        "more gets 503 with Retry-After. From --max-request-bytes to --max-buffered-bytes "
        "(default: a quarter of --max-buffered-bytes, at least --max-request-bytes).",
    ),
    Option(
        "--max-prompt-chars",
        "max_prompt_chars",
        cli_types.positive_int,
        "Prompts with more characters (or token ids) get 413, before they are tokenized "
        f"(default {DEFAULTS.max_prompt_chars}).",
    ),
    Option(
        "--max-connections",
        "max_connections",
        cli_types.positive_int,
        "Client connections open at once; beyond, the longest-waiting idle one is closed, or "
        "the newcomer gets 503 if all are busy (default "
        f"{DEFAULTS.max_connections}; lowered to what the open-file limit allows).",
    ),
    Option(
        "--max-in-flight",
        "max_in_flight",
        cli_types.positive_int,
        "Generation requests in flight at once; beyond, 503 with Retry-After "
        f"(default {DEFAULTS.max_in_flight}).",
    ),
    Option(
        "--hold-max-requests",
        "hold_max_requests",
        cli_types.non_negative_int,
        "Requests per model held while the model has no routable worker (scale from zero), "
        "dispatched by priority class, tenants taking turns, once one is; beyond, the newest "
        "request of a lower class or of a tenant over its share, or the newcomer, gets 503 "
        "with Retry-After. 0 turns "
        f"holding off: 503 at once (default {DEFAULTS.hold_max_requests}).",
    ),
    Option(
        "--hold-max-seconds",
        "hold_max_seconds",
        cli_types.duration_seconds,
        "Seconds a request may be held; then 503 with Retry-After "
        f"(default {DEFAULTS.hold_max_seconds:g}).",
    ),
    Option(
        "--drain-seconds",
        "drain_seconds",
        cli_types.duration_seconds,
        "On SIGTERM the router stops accepting connections (readiness fails), refuses held "
        "requests with 503 and Retry-After, and gives requests and streams in flight this "
        "long to finish before it exits; keep it below the pod's "
        f"terminationGracePeriodSeconds (default {DEFAULTS.drain_seconds:g}).",
    ),
    Option(
        "--hold-models",
        "hold_models",
        _comma_list,
        "Models held under their own name before any worker has reported them (the "
        "operator passes the served name); requests for other unknown models are held as "
        "`other` while no worker is routable, else 404.",
        metavar="NAME[,NAME]",
    ),
    Option(
        "--hold-models-only",
        "hold_models_only",
        _auto_bool,
        "Serve only the models of --hold-models (a namespace gateway's selection): a "
        "request for another model gets 404, whatever workers discovery finds (default: "
        "off).",
        switch=True,
    ),
    Option(
        "--demand-lease",
        "demand_lease",
        str,
        "A coordination.k8s.io Lease in --namespace whose renewTime the router sets while "
        "requests arrive, are in flight or held: the operator scales from zero and back to "
        "zero on it (needs --discovery kubernetes; default: none).",
    ),
    Option(
        "--demand-leases",
        "demand_leases",
        _comma_list,
        "One Lease per model (a namespace gateway's): each is renewed, as --demand-lease, only "
        "while its own model's requests arrive, are in flight or held, so a model at zero is "
        "woken by its own requests alone (needs --discovery kubernetes; default: none).",
        metavar="MODEL=LEASE[,MODEL=LEASE]",
    ),
    Option(
        "--hold-model-share",
        "hold_model_share",
        cli_types.positive_float,
        "The share (above 0, at most 1) of the held requests' byte budget one model's hold "
        "queue may take, so one model's flood leaves the others room "
        f"(default {DEFAULTS.hold_model_share:g}).",
    ),
    Option(
        "--max-in-flight-per-model",
        "max_in_flight_per_model",
        cli_types.positive_int,
        "Generation requests of one model in flight at once; beyond, 429 for that model "
        "while the others keep the rest of --max-in-flight (default: --max-in-flight).",
    ),
    Option(
        "--demand-interval",
        "demand_interval_seconds",
        cli_types.duration_seconds,
        "Seconds between the Lease's renewals while there is demand; a newly held request "
        f"renews it at once (default {DEFAULTS.demand_interval_seconds:g}).",
    ),
    Option(
        "--header-timeout",
        "header_timeout_seconds",
        cli_types.duration_seconds,
        "Seconds for a request head to arrive, from its first byte (or the connection's "
        f"opening); then 408 (default {DEFAULTS.header_timeout_seconds:g}).",
    ),
    Option(
        "--body-timeout",
        "body_timeout_seconds",
        cli_types.duration_seconds,
        "Seconds for a request body to arrive after its head; then 408 "
        f"(default {DEFAULTS.body_timeout_seconds:g}).",
    ),
    Option(
        "--keep-alive-timeout",
        "keep_alive_timeout_seconds",
        cli_types.duration_seconds,
        "Seconds an idle keep-alive client connection stays open "
        f"(default {DEFAULTS.keep_alive_timeout_seconds:g}).",
    ),
    Option(
        "--send-timeout",
        "send_timeout_seconds",
        cli_types.duration_seconds,
        "Seconds a client may stop reading a response before its connection (and request) "
        f"is dropped (default {DEFAULTS.send_timeout_seconds:g}).",
    ),
    Option(
        "--max-response-bytes",
        "max_response_bytes",
        cli_types.positive_int,
        "Larger worker responses are cut: 502, or an error event in a stream "
        f"(default {DEFAULTS.max_response_bytes}).",
    ),
    Option(
        "--connect-timeout",
        "connect_timeout_seconds",
        cli_types.duration_seconds,
        f"Seconds to connect to a worker (default {DEFAULTS.connect_timeout_seconds:g}).",
    ),
    Option(
        "--first-byte-timeout",
        "first_byte_timeout_seconds",
        cli_types.duration_seconds,
        "Most seconds a worker is given to start answering (the time given is derived from "
        "the request; then retried elsewhere, or 504) "
        f"(default {DEFAULTS.first_byte_timeout_seconds:g}).",
    ),
    Option(
        "--first-byte-timeout-floor",
        "first_byte_timeout_floor_seconds",
        cli_types.duration_seconds,
        "Least seconds a worker is given to start answering "
        f"(default {DEFAULTS.first_byte_timeout_floor_seconds:g}).",
    ),
    Option(
        "--min-prefill-rate",
        "min_prefill_tokens_per_second",
        cli_types.positive_float,
        "Slowest prefill (prompt tokens per second) the first-byte time allows for "
        f"(default {DEFAULTS.min_prefill_tokens_per_second:g}).",
    ),
    Option(
        "--min-decode-rate",
        "min_decode_tokens_per_second",
        cli_types.positive_float,
        "Slowest decoding (tokens per second) the first-byte time of a non-streamed answer "
        f"allows for (default {DEFAULTS.min_decode_tokens_per_second:g}).",
    ),
    Option(
        "--stream-idle-timeout",
        "stream_idle_timeout_seconds",
        cli_types.duration_seconds,
        "Seconds a started stream may send nothing before it is cut with an error event "
        f"(default {DEFAULTS.stream_idle_timeout_seconds:g}).",
    ),
    Option(
        "--request-timeout",
        "request_timeout_seconds",
        cli_types.duration_seconds,
        f"Seconds a whole request may take (default {DEFAULTS.request_timeout_seconds:g}).",
    ),
    Option(
        "--max-retries",
        "max_retries",
        cli_types.non_negative_int,
        "Retries on another worker for failures before the first byte "
        f"(default {DEFAULTS.max_retries}).",
    ),
    Option(
        "--migration-limit",
        "migration_limit",
        cli_types.non_negative_int,
        "Times a stream whose engine died mid-answer continues on another engine from the "
        f"tokens already sent; 0: never (default {DEFAULTS.migration_limit}).",
    ),
    Option(
        "--retry-budget-percent",
        "retry_budget_percent",
        cli_types.non_negative_float,
        "Retries in flight may be at most this percent of the requests in flight "
        f"(default {DEFAULTS.retry_budget_percent:g}).",
    ),
    Option(
        "--retry-budget-min",
        "retry_budget_min",
        cli_types.non_negative_int,
        "Retries in flight always allowed, whatever the percent "
        f"(default {DEFAULTS.retry_budget_min}).",
    ),
    Option(
        "--health-check-interval",
        "health_check_interval_seconds",
        cli_types.non_negative_float,
        f"Seconds between health checks; 0 = off (default "
        f"{DEFAULTS.health_check_interval_seconds:g}).",
    ),
    Option(
        "--models-refresh-interval",
        "models_refresh_seconds",
        cli_types.non_negative_float,
        "Seconds between re-reading each routable worker's /v1/models (its models and loaded "
        f"LoRA adapters); 0 = only when it turns routable (default "
        f"{DEFAULTS.models_refresh_seconds:g}).",
    ),
    Option(
        "--load-poll-interval",
        "load_poll_interval_seconds",
        cli_types.non_negative_float,
        "Seconds between polls of every worker's engine load (/v1/loads), so router replicas "
        f"see each other's requests; 0 = off (default {DEFAULTS.load_poll_interval_seconds:g}).",
    ),
    Option(
        "--peer-port",
        "peer_port",
        cli_types.port,
        "Peer with the other router replicas: publish this router's routing decisions on "
        "tcp://HOST:PORT (HOST as --host) and apply theirs, read from --peer and "
        "--peers-from-dns on the same port; answer KV snapshots on PORT+1 and, with a "
        "block index, start from a peer's; 0 = no peering (default 0).",
    ),
    Option(
        "--peers-from-dns",
        "peers_from_dns",
        str,
        "A DNS name whose addresses are the peer replicas (e.g. a headless Service "
        "NAME.NAMESPACE.svc), resolved every --peers-refresh-interval; needs --peer-port.",
        metavar="NAME",
    ),
    Option(
        "--peers-refresh-interval",
        "peers_refresh_interval_seconds",
        cli_types.duration_seconds,
        "Seconds between resolutions of --peers-from-dns "
        f"(default {DEFAULTS.peers_refresh_interval_seconds:g}).",
    ),
    Option(
        "--peer-key-file",
        "peer_key_file",
        str,
        "A file holding the router replicas' shared secret (16 to 4096 bytes): every "
        "peering socket then needs it (ZMQ CURVE), so a client without it reads no routing "
        "decision and asks no KV snapshot. Required with --peer-port unless --host is a "
        "loopback address.",
        metavar="FILE",
    ),
    Option(
        "--health-check-timeout",
        "health_check_timeout_seconds",
        cli_types.duration_seconds,
        f"Seconds per health check (default {DEFAULTS.health_check_timeout_seconds:g}).",
    ),
    Option(
        "--health-failure-threshold",
        "health_failure_threshold",
        cli_types.positive_int,
        f"Failed checks that eject a worker (default {DEFAULTS.health_failure_threshold}).",
    ),
    Option(
        "--health-success-threshold",
        "health_success_threshold",
        cli_types.positive_int,
        f"Passing checks that re-admit it (default {DEFAULTS.health_success_threshold}).",
    ),
    Option(
        "--outlier-consecutive-failures",
        "outlier_consecutive_failures",
        cli_types.positive_int,
        "Consecutive failed requests (5xx, timeouts, broken connections) that eject a worker "
        f"(default {DEFAULTS.outlier_consecutive_failures}).",
    ),
    Option(
        "--outlier-failure-rate",
        "outlier_failure_rate",
        cli_types.positive_float,
        "Share of failed requests in an interval that ejects a worker "
        f"(default {DEFAULTS.outlier_failure_rate:g}).",
    ),
    Option(
        "--outlier-min-requests",
        "outlier_min_requests",
        cli_types.positive_int,
        "Requests an interval needs before the failure rate counts "
        f"(default {DEFAULTS.outlier_min_requests}).",
    ),
    Option(
        "--outlier-interval",
        "outlier_interval_seconds",
        cli_types.duration_seconds,
        f"Seconds of the failure-rate window (default {DEFAULTS.outlier_interval_seconds:g}).",
    ),
    Option(
        "--outlier-base-ejection",
        "outlier_base_ejection_seconds",
        cli_types.duration_seconds,
        "Seconds of a first ejection; the n-th lasts n times this "
        f"(default {DEFAULTS.outlier_base_ejection_seconds:g}).",
    ),
    Option(
        "--outlier-max-ejection",
        "outlier_max_ejection_seconds",
        cli_types.duration_seconds,
        f"Longest ejection in seconds (default {DEFAULTS.outlier_max_ejection_seconds:g}).",
    ),
    Option(
        "--outlier-max-ejected-percent",
        "outlier_max_ejected_percent",
        cli_types.non_negative_float,
        "Most workers ejected at once, in percent (at least one may be) "
        f"(default {DEFAULTS.outlier_max_ejected_percent:g}).",
    ),
    Option(
        "--api-keys-file",
        "api_keys_file",
        str,
        "JSON file of API keys (a mounted Secret): generation routes and /v1/models then need "
        "one (Authorization: Bearer KEY); per-key tenant, priority, rate limits, admin role "
        "(docs/router.md, Authentication). Default: no keys.",
        metavar="FILE",
    ),
    Option(
        "--api-keys-reload-seconds",
        "api_keys_reload_seconds",
        cli_types.duration_seconds,
        "How often the keys file is checked for changes "
        f"(default {DEFAULTS.api_keys_reload_seconds:g}).",
    ),
    Option(
        "--admin",
        "admin",
        str,
        "Who may use the admin API (/workers, /flush_cache, ...): loopback (an admin key, or "
        "any client of a listener bound to a loopback address: --host 127.0.0.1, or "
        "--admin-port; never trusted for its own address), keys (an admin key only), open "
        f"(anyone), off (default {DEFAULTS.admin}).",
        choices=ADMIN_MODES,
    ),
    Option(
        "--admin-port",
        "admin_port",
        cli_types.port,
        "Also serve the admin API on 127.0.0.1:PORT (on --host when that is a loopback "
        "address), to this host (pod) only, without a key: "
        "what kubectl port-forward reaches. Needs --admin loopback. Default: none.",
    ),
    Option(
        "--picker-port",
        "picker_port",
        cli_types.port,
        "Also serve the Endpoint Picker protocol of the Gateway API Inference Extension "
        "(Envoy ext_proc gRPC, with gRPC health) on this port, for a gateway's "
        "InferencePool (docs/gateway.md); 0 = a free port. Default: off.",
    ),
    Option(
        "--picker-tls",
        "picker_tls",
        _auto_bool,
        "With --picker-port: serve TLS there with a self-signed certificate made at start, "
        "as the Inference Extension's pickers do by default (gateways do not verify it). "
        "Default: off (plaintext gRPC).",
        switch=True,
    ),
    Option(
        "--picker-test-headers",
        "picker_test_headers",
        _auto_bool,
        "With --picker-port: honour the conformance suite's test-epp-endpoint-selection "
        "header and answer x-conformance-test-served-endpoint (for conformance runs only; "
        "any client may set that header). Default: off.",
        switch=True,
    ),
    Option(
        "--picker-token-file",
        "picker_token_file",
        str,
        "With --picker-port: a file holding the gateway's token (16 to 4096 printable "
        "characters, a mounted Secret); a stream without gRPC metadata 'authorization: Bearer "
        "TOKEN' is refused with UNAUTHENTICATED (Envoy sends it with the ext_proc "
        "grpc_service's initial_metadata). Required unless --host is a loopback address or "
        "--picker-no-token is given.",
        metavar="FILE",
    ),
    Option(
        "--picker-no-token",
        "picker_no_token",
        _auto_bool,
        "With --picker-port: serve it without a token on a non-loopback --host, for gateways "
        "that cannot present one (those building their ext_proc configuration from an "
        "InferencePool); a NetworkPolicy must keep the port to the gateway's pods. An explicit "
        "opt-out: without it (or --picker-token-file) the router refuses to start.",
        switch=True,
    ),
    Option(
        "--picker-max-in-flight",
        "picker_max_in_flight",
        cli_types.positive_int,
        "With --picker-port: the picker's own requests in flight (picked, answer not ended), "
        "apart from --max-in-flight's, which the HTTP port keeps; beyond, 429. Default: "
        "--max-in-flight.",
    ),
    Option(
        "--picker-max-buffered-bytes",
        "picker_max_buffered_bytes",
        cli_types.positive_int,
        "With --picker-port: the request bodies the picker holds at once, its own share of "
        "--max-buffered-bytes (the HTTP port keeps the rest); beyond, 503 with Retry-After. "
        "Default: a quarter of --max-buffered-bytes, at least --max-request-bytes.",
    ),
    Option(
        "--picker-max-connections",
        "picker_max_connections",
        cli_types.positive_int,
        "With --picker-port: gateway connections open at once on that port; a connection "
        "beyond it is closed at once, one holding no stream for --keep-alive-timeout is closed "
        f"(default {DEFAULTS.picker_max_connections}).",
    ),
    Option(
        "--picker-max-connections-per-address",
        "picker_max_connections_per_address",
        cli_types.positive_int,
        "With --picker-port: of --picker-max-connections, what one source address may hold "
        "before a stream on the connection presents the gateway's token (--picker-token-file; "
        "without a token, every connection counts); a newcomer past it is closed at once "
        f"(default {DEFAULTS.picker_max_connections_per_address}).",
    ),
    Option(
        "--picker-max-message-bytes",
        "picker_max_message_bytes",
        cli_types.positive_int,
        "With --picker-port: the largest ext_proc message taken (a larger one ends its stream "
        "with RESOURCE_EXHAUSTED before it is buffered): at least the gateway's largest body "
        "chunk (Envoy: its per_connection_buffer_limit_bytes, 1 MiB by default). The picker "
        "may hold about one message per open stream, so memory grows with it "
        f"(default {DEFAULTS.picker_max_message_bytes}).",
    ),
    Option("--seed", "seed", cli_types.non_negative_int, "Seed for randomised policies."),
    Option(
        "--pd-disaggregation",
        "pd_disaggregation",
        _auto_bool,
        "PD mode with workers found by discovery: a pod labelled "
        "serving.tpuserve.dev/pd-role=prefill|decode is a pair's worker (a prefill's bootstrap "
        "port from its sglang.ai/bootstrap-port annotation). --prefill/--decode imply it.",
        switch=True,
    ),
    Option(
        "--pd-policy",
        "pd_policy",
        str,
        "PD mode: conditional (a prompt goes to a prefill/decode pair when its prefill on "
        "the colocated --worker would stall that worker's decodes for "
        "--pd-itl-budget-seconds, else to that worker) or always "
        f"(default {DEFAULTS.pd_policy}).",
        choices=PD_POLICIES,
    ),
    Option(
        "--pd-threshold-tokens",
        "pd_threshold_tokens",
        cli_types.non_negative_int,
        "Uncached prompt tokens from which a request is disaggregated (default: derived from "
        "--pd-perf-model and --pd-itl-budget-seconds, and a shorter suffix after a long cached "
        "prefix is timed by that model too).",
    ),
    Option(
        "--pd-perf-model",
        "pd_perf_model",
        str,
        "The colocated workers' slice and model, GENERATION:TOPOLOGY:PROFILE, whose "
        f"performance model sets the threshold (default {DEFAULTS.pd_perf_model}).",
        metavar="GEN:TOPOLOGY:PROFILE",
    ),
    Option(
        "--pd-itl-budget-seconds",
        "pd_itl_budget_seconds",
        cli_types.positive_float,
        "The longest prefill stall a colocated worker's decodes may take: a request whose "
        "prefill there takes this long goes to a pair "
        f"(default {DEFAULTS.pd_itl_budget_seconds:g}).",
    ),
    Option(
        "--pd-handoff-timeout-seconds",
        "pd_handoff_timeout_seconds",
        cli_types.duration_seconds,
        "Most seconds a pair's legs are waited for before both are aborted; keep it at most "
        "the engines' SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and ..._WAITING_TIMEOUT "
        f"(default {DEFAULTS.pd_handoff_timeout_seconds:g}, SGLang's).",
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--worker",
        dest="workers",
        action="append",
        metavar="[MODEL=]URL",
        help="A worker's base URL, http://HOST:PORT, optionally with the served model it "
        "belongs to (MODEL=URL; else read from its /v1/models); repeat for more "
        "(env: comma-separated).",
    )
    parser.add_argument(
        "--prefill",
        dest="prefill",
        action="append",
        nargs="+",
        metavar="URL [BOOTSTRAP_PORT]",
        help="PD mode: a prefill worker's base URL and its bootstrap port (SGLang's "
        f"--disaggregation-bootstrap-port; default {DEFAULT_BOOTSTRAP_PORT}, 'none' alike); "
        "repeat for more (env: comma-separated 'URL PORT').",
    )
    parser.add_argument(
        "--decode",
        dest="decode",
        action="append",
        metavar="URL",
        help="PD mode: a decode worker's base URL; repeat for more (env: comma-separated).",
    )
    parser.add_argument(
        "--peer",
        dest="peers",
        action="append",
        metavar="tcp://HOST:PORT",
        help="A peer router replica's --peer-port endpoint (HOST: an IPv4 address, a DNS "
        "name or [IPv6 address]); repeat for more "
        "(env TPUSERVE_ROUTER_PEERS: comma-separated); needs --peer-port.",
    )
    parser.add_argument(
        "--policy-param",
        dest="policy_params",
        action="append",
        metavar="NAME=VALUE",
        help="A policy parameter, e.g. cache_threshold=0.5; repeat for more "
        "(see docs/router.md for each policy's parameters).",
    )
    for option in OPTIONS:
        if option.switch:
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(
                option.flag, dest=option.field, action="store_const", const=True,
                default=None, help=option.help,
            )  # fmt: skip
            pair.add_argument(
                "--no-" + option.flag.removeprefix("--"), dest=option.field,
                action="store_const", const=False, help=f"The opposite of {option.flag}.",
            )  # fmt: skip
            continue
        parser.add_argument(
            option.flag,
            dest=option.field,
            type=option.kind,
            default=None,
            metavar=option.metavar,
            choices=option.choices,
            help=option.help,
        )


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def build_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> RouterConfig:
    """Flags first, then ``TPUSERVE_ROUTER_*`` variables, then defaults; raises ConfigError."""
    env = dict(os.environ if environ is None else environ)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(args, option.field, None)  # argparse has converted and checked it
        if value is None:
            name = env_name(option.flag)
            raw = env.get(name)
            if raw is None or (option.kind is not str and not raw.strip()):
                continue
            try:
                value = option.kind(raw)
            except argparse.ArgumentTypeError as err:
                problems.append(f"{name}: {err}")
                continue
            if option.choices is not None and value not in option.choices:
                problems.append(f"{name}={raw!r}: allowed {', '.join(option.choices)}")
                continue
        values[option.field] = value
    if "selector" in values:
        try:
            values["selector"] = parse_key_values(values["selector"], "selector")
        except ValueError as err:
            problems.append(str(err))
    workers = args.workers
    if workers is None and env.get(env_name("--workers")):
        workers = [w for w in env[env_name("--workers")].replace(" ", ",").split(",") if w]
    if workers:
        values["workers"] = tuple(workers)
    prefill = [" ".join(values) for values in args.prefill] if args.prefill else None
    if prefill is None and env.get(env_name("--prefill")):
        prefill = list(_comma_list(env[env_name("--prefill")]))
    if prefill:
        values["prefill"] = tuple(prefill)
    decode = args.decode
    if decode is None and env.get(env_name("--decode")):
        decode = list(_comma_list(env[env_name("--decode")]))
    if decode:
        values["decode"] = tuple(decode)
    peers = args.peers
    if peers is None and env.get(env_name("--peers")):
        peers = _comma_list(env[env_name("--peers")])
    if peers:
        values["peers"] = tuple(peers)
    params = args.policy_params
    if params is None and env.get(env_name("--policy-params")):
        params = env[env_name("--policy-params")].split(",")
    if params:
        try:
            values["policy_params"] = parse_key_values(",".join(params), "policy-param")
        except ValueError as err:
            problems.append(str(err))
    config = RouterConfig(**values)
    try:
        validate(config)
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError(problems)
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
    except ConfigError as err:
        print(f"tpuserve router: {err}", file=sys.stderr)
        return 2
    import uvloop

    return uvloop.run(serve_until_signalled(config))


async def serve_until_signalled(config: RouterConfig) -> int:
    from tpuserve_router.app import create_router_app

    raise_open_file_limit()
    return_large_blocks()
    app = create_router_app(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
    except OSError as err:  # a port in use, an address not on this host
        print(f"tpuserve router: {err}", file=sys.stderr)
        return 1
    if os.environ.get("TPUSERVE_ROUTER_GC_TUNE", "1") == "1":
        tune_garbage_collector()
    print(f"tpuserve router: listening on {app.base_url}", file=sys.stderr, flush=True)
    await stop.wait()
    logging.getLogger(__name__).info("stopping")
    await app.stop()
    return 0


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one: every client connection, upstream
    connection and health check is a file descriptor (the app sizes its connection budget
    from the result)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:
            logging.getLogger(__name__).warning("could not raise the open-file limit: %s", err)


MMAP_THRESHOLD_BYTES = 128 * 1024
"""glibc's default threshold above which malloc maps a block of its own (and unmaps it when
freed); `return_large_blocks` pins it there."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def return_large_blocks() -> None:
    """Keep large blocks (request bodies, answers) out of the heap, so their memory goes back
    to the system when they are freed. glibc otherwise raises its mmap threshold each time
    such a block is freed, up to 32 MiB, and later bodies then land in the heap between small
    objects, where freed memory stays with the process: 40 clients sending 30 MB bodies in
    turn left the router 90 MB above its buffer budget. Setting the threshold turns that
    adjustment off. Nothing happens on a C library without mallopt."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        logging.getLogger(__name__).debug("mallopt unavailable: large blocks stay in the heap")


def tune_garbage_collector() -> None:
    """Move start-up objects out of the collector's way and collect the young generation
    less often: a request allocates a few hundred short-lived objects, and the default
    threshold (700) would run a collection every few requests."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)
