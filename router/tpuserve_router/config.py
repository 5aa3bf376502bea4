"""The router's settings, with their defaults.

`tpuserve_router.cli` fills a `RouterConfig` from flags and `TPUSERVE_ROUTER_*`
environment variables; tests and `tpuserve up` build one directly. This module is the bottom
of the router: it imports no other `tpuserve_router` module (only three of sglang_tpu's
defaults), and each package makes its own settings objects from a `RouterConfig`.
`tpuserve_router.config_checks` checks what the values alone decide; what needs a package's own
logic (a key file, a worker URL, a policy's parameters, a performance model) that package
checks, and `tpuserve_router.validation.validate` runs them all at start-up, reporting every
problem at once, each naming the setting, its value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from sglang_tpu.disaggregation import (
    DEFAULT_BOOTSTRAP_TIMEOUT_SECONDS,
    DEFAULT_ITL_BUDGET_SECONDS,
)
from sglang_tpu.perf_model import DEFAULT_PROFILE

DEFAULT_POLICY = "precise"
"""The routing policy when none is given: the winner of the routing benchmark (issue 8,
docs/benchmarks.md): best or tied p99 on W1-W6 and W8 with KV events, p99 TTFT at the oracle's
level on the long-context W9 and W10 (issue 14), about even with cache_aware without them.
The operator and the chart leave the policy unset by default, so this is the one place the
default is spelled."""

ENGINE_TYPES: Final = ("auto", "sglang", "sglang-jax")
"""``--engine-type``: which engine the workers run (`engines.engine_types`); auto: detected."""

MAX_UNIX_PATH_BYTES: Final = 107
"""The longest unix socket path the kernel takes (sun_path is 108 bytes with its NUL)."""

DEFAULT_PD_PERF_MODEL: Final = f"v6e:1x1:{DEFAULT_PROFILE}"
"""The slice and model `--pd-threshold-tokens` is derived for when neither is given (the
engine twin's defaults); the operator passes the role's own."""

DEFAULT_LEADER_LABEL = "serving.tpuserve.dev/role=leader"
DEFAULT_WORKER_URL_ANNOTATION = "serving.tpuserve.dev/worker-url"
DEFAULT_KV_EVENTS_ANNOTATION = "serving.tpuserve.dev/kv-events-endpoint"
DEFAULT_KV_REPLAY_ANNOTATION = "serving.tpuserve.dev/kv-replay-endpoint"
DEFAULT_MODEL_LABEL = "model"
"""The pod label naming the served model a discovered worker belongs to (the operator sets
it to ``servedName`` on engine pods)."""

Discovery = Literal["static", "kubernetes"]
AdminMode = Literal["loopback", "keys", "open", "off"]
ADMIN_MODES: tuple[AdminMode, ...] = ("loopback", "keys", "open", "off")
DISCOVERY_MODES: tuple[Discovery, ...] = ("static", "kubernetes")
PD_POLICIES: Final = ("conditional", "always")

DEFAULT_MAX_BUFFERED_BYTES: Final = 512 * 1024 * 1024


class ConfigError(ValueError):
    """One or more settings are invalid; ``problems`` lists them, one sentence each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid router settings:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None  # listen on this unix socket instead of host:port
    workers: tuple[str, ...] = ()
    discovery: Discovery = "static"
    namespace: str | None = None
    selector: dict[str, str] = field(default_factory=dict)
    leader_label: str = DEFAULT_LEADER_LABEL
    worker_port: int | None = None
    worker_url_annotation: str = DEFAULT_WORKER_URL_ANNOTATION
    model_label: str = DEFAULT_MODEL_LABEL
    worker_networks: tuple[str, ...] = ()  # CIDRs the router may dial; empty: any
    policy: str = DEFAULT_POLICY
    policy_params: dict[str, str] = field(default_factory=dict)
    kv_events: bool | None = None  # None (auto): subscribe when the policy uses KV events
    engine_type: str = "auto"  # ENGINE_TYPES: the workers' engine, or detected per worker
    kv_snapshot_from: str | None = None  # a peer router's URL (kv_events.py: snapshots)
    kv_snapshot_key_file: str | None = None  # holds an admin key the peer accepts
    # A snapshot from a peer (over HTTP, or over peering: peer_snapshot.py): how long a start
    # waits for one in all, and the most bytes taken.
    kv_snapshot_timeout_seconds: float = 10.0
    kv_snapshot_max_bytes: int = 256 * 1024 * 1024
    tokenizer: str | None = None
    # The token cache's bound, in bytes of memory (pipeline/token_cache.py: MAX_BYTES).
    token_cache_bytes: int = 64 * 1024 * 1024
    metrics_port: int | None = None
    # The front's limits (server.FrontLimits), as uvicorn, aiohttp and Envoy bound theirs.
    max_request_line_bytes: int = 8 * 1024
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    max_request_bytes: int = 32 * 1024 * 1024
    # Request bodies held at once, router-wide (connections.BufferBudget): a quarter of the
    # chart's 2 GiB router memory limit (the operator renders a quarter of the pod's limit).
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    # Of them, what one client (a key's tenant, else an address) may hold; None: a quarter.
    max_buffered_bytes_per_client: int | None = None
    max_prompt_chars: int = 4 * 1024 * 1024  # also the most token ids a prompt may have
    max_connections: int = 10_000
    max_in_flight: int = 4096
    # Scale from zero (hold.py, demand.py): requests held while no worker is routable.
    hold_max_requests: int = 0  # per model; 0: no holding, 503 at once
    hold_max_seconds: float = 300.0
    hold_models: tuple[str, ...] = ()
    hold_models_only: bool = False  # a gateway's: a model not in hold_models gets 404
    demand_lease: str | None = None
    # A namespace gateway's per-model Leases ("MODEL=LEASE") and shares (model_shares.py).
    demand_leases: tuple[str, ...] = ()
    demand_interval_seconds: float = 5.0
    hold_model_share: float = 1.0
    max_in_flight_per_model: int | None = None
    # On SIGTERM: requests and streams in hand finish within this (fits Kubernetes' default
    # 30 s terminationGracePeriodSeconds; a longer pod grace wants a longer drain).
    drain_seconds: float = 25.0
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 60.0
    keep_alive_timeout_seconds: float = 30.0
    send_timeout_seconds: float = 60.0
    max_response_bytes: int = 64 * 1024 * 1024
    connect_timeout_seconds: float = 3.0
    # A worker's first byte is awaited for a time derived from the request (pipeline/relay.py,
    # first_byte_deadline): at least the floor, at most first_byte_timeout_seconds.
    first_byte_timeout_seconds: float = 600.0
    first_byte_timeout_floor_seconds: float = 15.0
    min_prefill_tokens_per_second: float = 1000.0
    min_decode_tokens_per_second: float = 5.0
    stream_idle_timeout_seconds: float = 30.0
    request_timeout_seconds: float = 1800.0
    max_retries: int = 2
    migration_limit: int = 2
    """Times a stream whose engine died mid-answer continues on another engine."""
    retry_budget_percent: float = 20.0  # of the requests in flight, as Envoy's retry budget
    retry_budget_min: int = 3
    health_check_interval_seconds: float = 2.0
    health_check_timeout_seconds: float = 2.0
    health_failure_threshold: int = 3
    models_refresh_seconds: float = 30.0  # re-read each worker's /v1/models (LoRA adapters)
    health_success_threshold: int = 1
    # load_view.py: every worker's /v1/loads, so router replicas see each other's load.
    load_poll_interval_seconds: float = 0.1
    # peers.py: router replicas tell each other their decisions (0: no peering).
    peer_port: int = 0
    peers: tuple[str, ...] = ()  # tcp://HOST:PORT of static peers
    peers_from_dns: str | None = None  # a name whose addresses are the peers (headless Service)
    peers_refresh_interval_seconds: float = 5.0
    peer_key_file: str | None = None  # the replicas' shared secret (peer_auth.py)
    # Outlier ejection (outliers.py), with Envoy's defaults where it has them.
    outlier_consecutive_failures: int = 5
    outlier_failure_rate: float = 0.5
    outlier_min_requests: int = 20
    outlier_interval_seconds: float = 10.0
    outlier_base_ejection_seconds: float = 30.0
    outlier_max_ejection_seconds: float = 300.0
    outlier_max_ejected_percent: float = 50.0
    max_idle_connections_per_worker: int = 64
    api_keys_file: str | None = None  # auth.py: keys for the data plane; none: no keys
    api_keys_reload_seconds: float = 10.0
    admin: AdminMode = "loopback"  # who may use the admin API (app.py)
    admin_port: int | None = None  # the admin API on 127.0.0.1 only (app.py)
    # picker.py: the Endpoint Picker protocol (Envoy ext_proc gRPC) for a gateway's
    # InferencePool; None: off.
    picker_port: int | None = None
    picker_test_headers: bool = False  # the conformance suite's steering headers
    picker_tls: bool = False  # serve TLS with a self-signed certificate (picker.py)
    picker_token_file: str | None = None  # the gateway's token (gRPC metadata); None: none
    picker_max_connections: int = 256  # gateway connections open at once on the picker port
    # of them, what one source address may hold before a stream on it authenticates
    picker_max_connections_per_address: int = 64
    # The largest ext_proc message the picker takes: one body chunk of Envoy's (at most about
    # its per_connection_buffer_limit_bytes, 1 MiB by default), with room to spare.
    picker_max_message_bytes: int = 2 * 1024 * 1024
    # The picker's own shares (picker.py), apart from the HTTP port's: requests in flight
    # (None: --max-in-flight) and request bodies buffered, carved out of max_buffered_bytes
    # (None: a quarter of it, at least one body of max_request_bytes).
    picker_max_in_flight: int | None = None
    picker_max_buffered_bytes: int | None = None
    # Serve the picker without a token on a non-loopback host: an explicit opt-out, for
    # gateways that cannot present one (a NetworkPolicy must keep the port to the gateway).
    picker_no_token: bool = False
    seed: int | None = None
    # PD mode (pd.py): prefill and decode workers, routed as pairs
    pd_disaggregation: bool | None = False  # PD mode with discovered roles (a pod's pd-role label)
    prefill: tuple[str, ...] = ()  # "URL" or "URL BOOTSTRAP_PORT", as --prefill
    decode: tuple[str, ...] = ()
    pd_policy: str = "conditional"
    pd_threshold_tokens: int | None = None  # None: from the performance model
    pd_perf_model: str = DEFAULT_PD_PERF_MODEL
    pd_itl_budget_seconds: float = DEFAULT_ITL_BUDGET_SECONDS
    pd_handoff_timeout_seconds: float = DEFAULT_BOOTSTRAP_TIMEOUT_SECONDS

    def replace(self, **changes: Any) -> RouterConfig:
        return dataclasses.replace(self, **changes)

    def client_buffer_bytes(self) -> int:
        """What one client may hold of the HTTP port's buffer budget:
        ``max_buffered_bytes_per_client``, or a quarter of the budget, at least one body of
        ``max_request_bytes``."""
        budget = self.http_buffer_bytes()
        if self.max_buffered_bytes_per_client is not None:
            return min(self.max_buffered_bytes_per_client, budget)
        share = max(budget // 4, self.max_request_bytes)
        return min(share, budget)

    def picker_buffer_bytes(self) -> int:
        """The endpoint picker's own buffer budget (0 without ``picker_port``):
        ``picker_max_buffered_bytes``, or a quarter of ``max_buffered_bytes``, at least one
        body of ``max_request_bytes``."""
        if self.picker_port is None:
            return 0
        if self.picker_max_buffered_bytes is not None:
            return self.picker_max_buffered_bytes
        return max(self.max_buffered_bytes // 4, self.max_request_bytes)

    def http_buffer_bytes(self) -> int:
        """The HTTP port's buffer budget: ``max_buffered_bytes`` less the picker's share."""
        return max(self.max_request_bytes, self.max_buffered_bytes - self.picker_buffer_bytes())

    def picker_in_flight(self) -> int:
        """The endpoint picker's own in-flight limit: ``picker_max_in_flight``, else
        ``max_in_flight``."""
        if self.picker_max_in_flight is not None:
            return self.picker_max_in_flight
        return self.max_in_flight


MIN_TOKEN_BYTES: Final = 16
MAX_TOKEN_BYTES: Final = 4096


def read_token(path: str) -> bytes:
    """The picker's token: ``path``'s content, surrounding white space dropped; ValueError
    naming the file and what is allowed."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TOKEN_BYTES + 1)
    except OSError as err:
        raise ValueError(f"{path!r}: cannot be read: {err.strerror or err}") from None
    token = data.strip()
    if not MIN_TOKEN_BYTES <= len(token) <= MAX_TOKEN_BYTES or not all(
        0x21 <= b <= 0x7E for b in token
    ):
        raise ValueError(
            f"{path!r}: holds {len(token)} bytes of token; allowed: {MIN_TOKEN_BYTES} to "
            f"{MAX_TOKEN_BYTES} printable ASCII characters without spaces (it travels as gRPC "
            "metadata; e.g. head -c 32 /dev/urandom | base64)"
        )
    return token


def snapshot_port(peer_port: int) -> int:
    """The port KV snapshots are asked on (`peering.peer_snapshot`): the peer port's next one."""
    return peer_port + 1


class UsesKvEvents(Protocol):
    """What `kv_events_enabled` reads of a policy (`policies.base.Policy`)."""

    @property
    def uses_kv_events(self) -> bool: ...


def kv_events_enabled(setting: bool | None, policy: UsesKvEvents) -> bool:
    """Whether the router subscribes to the workers' KV events: ``--kv-events`` or
    ``--no-kv-events`` when given, else whatever the policy's ``uses_kv_events`` says."""
    return policy.uses_kv_events if setting is None else setting


def parse_key_values(text: str, what: str) -> dict[str, str]:
    """``k=v[,k=v]`` into a dict; raises ValueError naming ``what`` and the bad item."""
    result: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what}: {item!r} is not KEY=VALUE")
        result[key.strip()] = value.strip()
    return result
