"""The router among others: the flags of `tpuserve router` for peering, worker health and
outlier ejection, API keys, the admin API, the Endpoint Picker and PD disaggregation."""

from __future__ import annotations

from sglang_tpu import cli_types
from tpuserve_router.config import ADMIN_MODES, PD_POLICIES
from tpuserve_router.options.option import DEFAULTS, Option, auto_bool

FLEET: tuple[Option, ...] = (
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
        auto_bool,
        "With --picker-port: serve TLS there with a self-signed certificate made at start, "
        "as the Inference Extension's pickers do by default (gateways do not verify it). "
        "Default: off (plaintext gRPC).",
        switch=True,
    ),
    Option(
        "--picker-test-headers",
        "picker_test_headers",
        auto_bool,
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
        auto_bool,
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
        auto_bool,
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
