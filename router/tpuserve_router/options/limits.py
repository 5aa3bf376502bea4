"""What the router holds and how long it waits: the flags of `tpuserve router` for request
and buffer limits, in-flight caps, hold queues and demand, timeouts, retries and polls."""

from __future__ import annotations

from sglang_tpu import cli_types
from tpuserve_router.options.option import DEFAULTS, Option, auto_bool, comma_list

LIMITS: tuple[Option, ...] = (
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
        comma_list,
        "Models held under their own name before any worker has reported them (the "
        "operator passes the served name); requests for other unknown models are held as "
        "`other` while no worker is routable, else 404.",
        metavar="NAME[,NAME]",
    ),
    Option(
        "--hold-models-only",
        "hold_models_only",
        auto_bool,
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
        comma_list,
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
)
