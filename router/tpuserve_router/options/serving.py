"""Where the router listens, where its workers are and how it routes: the flags of
`tpuserve router` for the listeners, worker discovery, the policy and the KV view."""

from __future__ import annotations

from sglang_tpu import cli_types
from tpuserve_router.config import (
    DEFAULT_LEADER_LABEL,
    DEFAULT_MODEL_LABEL,
    DEFAULT_POLICY,
    DEFAULT_WORKER_URL_ANNOTATION,
    DISCOVERY_MODES,
    ENGINE_TYPES,
)
from tpuserve_router.options.option import DEFAULTS, Option, auto_bool, comma_list
from tpuserve_router.policies.base import registered_policy_names

SERVING: tuple[Option, ...] = (
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
        comma_list,
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
        auto_bool,
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
)
