"""The router's settings, with their defaults, and the checks of their values.

`tpuserve_router.cli` fills a `RouterConfig` from flags and `TPUSERVE_ROUTER_*`
environment variables; tests and `tpuserve up` build one directly. This module is the bottom
of the router: it imports no other `tpuserve_router` module (only three of sglang_tpu's
defaults), and each package makes its own settings objects from a `RouterConfig`.
``RouterConfig.problems()`` checks what the values alone decide; what needs a package's own
logic (a key file, a worker URL, a policy's parameters, a performance model) that package
checks, and `tpuserve_router.validation.validate` runs them all at start-up, reporting every
problem at once, each naming the setting, its value and what is allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import stat
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

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*$")
"""A DNS name: dot-separated labels of letters, digits and '-' (not first nor last)."""
MAX_HELD_PER_MODEL = 100_000
DEFAULT_MAX_BUFFERED_BYTES: Final = 512 * 1024 * 1024
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


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

    def _pd_problems(self) -> list[str]:
        problems: list[str] = []
        if bool(self.prefill) != bool(self.decode):
            problems.append(
                f"prefill={list(self.prefill)}, decode={list(self.decode)}: PD mode needs both "
                "prefill and decode workers"
            )
        if self.pd_policy not in PD_POLICIES:
            problems.append(f"pd_policy={self.pd_policy!r}: allowed {', '.join(PD_POLICIES)}")
        if self.pd_threshold_tokens is not None and self.pd_threshold_tokens < 0:
            problems.append(f"pd_threshold_tokens={self.pd_threshold_tokens}: allowed >= 0")
        if not self.pd_itl_budget_seconds > 0:
            problems.append(f"pd_itl_budget_seconds={self.pd_itl_budget_seconds}: allowed > 0")
        if not self.pd_handoff_timeout_seconds > 0:
            problems.append(
                f"pd_handoff_timeout_seconds={self.pd_handoff_timeout_seconds}: allowed > 0 "
                "(at most the engines' SGLANG_DISAGGREGATION_*_TIMEOUT)"
            )
        return problems

    def problems(self) -> list[str]:
        """What is wrong with the values themselves, one sentence each naming the setting;
        `tpuserve_router.validation.validate` adds what the packages check and raises."""
        problems: list[str] = self._pd_problems()

        def need(ok: bool, message: str) -> None:
            if not ok:
                problems.append(message)

        need(0 <= self.port <= 65535, f"port={self.port}: allowed 0..65535 (0 = any free)")
        need(
            self.engine_type in ENGINE_TYPES,
            f"engine_type={self.engine_type!r}: allowed {', '.join(ENGINE_TYPES)}",
        )
        if self.uds is not None:
            problems += uds_problems(self.uds)
        if self.metrics_port is not None:
            need(
                0 <= self.metrics_port <= 65535,
                f"metrics_port={self.metrics_port}: allowed 0..65535",
            )
        if self.worker_port is not None:
            need(
                1 <= self.worker_port <= 65535,
                f"worker_port={self.worker_port}: allowed 1..65535",
            )
        need(
            self.discovery in DISCOVERY_MODES,
            f"discovery={self.discovery!r}: allowed {', '.join(DISCOVERY_MODES)}",
        )
        if self.discovery == "kubernetes":
            need(
                bool(self.selector),
                "selector: required with discovery=kubernetes (k=v[,k=v]), e.g. "
                "app.kubernetes.io/instance=my-model",
            )
            for key, value in self.selector.items():
                need(
                    bool(_LABEL_KEY.match(key)) and len(key) <= 317,
                    f"selector key {key!r}: not a valid Kubernetes label key",
                )
                need(
                    bool(_LABEL_VALUE.match(value)) and len(value) <= 63,
                    f"selector value {value!r} (key {key}): not a valid Kubernetes label value",
                )
            if self.leader_label:
                need(
                    self.leader_label.count("=") == 1,
                    f"leader_label={self.leader_label!r}: expected KEY=VALUE or empty",
                )
        elif not self.workers:
            pass  # workers may be added later through POST /workers
        for name, least in _SIZE_FLOORS.items():
            value = getattr(self, name)
            need(value >= least, f"{name}={value}: must be >= {least}")
        need(
            self.max_request_bytes <= self.max_buffered_bytes,
            f"max_request_bytes={self.max_request_bytes}: must be <= max_buffered_bytes="
            f"{self.max_buffered_bytes} (a body larger than every body the router may hold "
            "could never be read)",
        )
        share = self.max_buffered_bytes_per_client
        need(
            share is None or self.max_request_bytes <= share <= self.max_buffered_bytes,
            f"max_buffered_bytes_per_client={share}: allowed max_request_bytes="
            f"{self.max_request_bytes} to max_buffered_bytes={self.max_buffered_bytes} (one "
            "client's share must fit the largest body, and fit in the budget)",
        )
        need(
            self.max_request_line_bytes <= self.max_header_bytes,
            f"max_request_line_bytes={self.max_request_line_bytes}: must be <= "
            f"max_header_bytes={self.max_header_bytes} (the request line is part of the head)",
        )
        for name in (
            "header_timeout_seconds",
            "body_timeout_seconds",
            "keep_alive_timeout_seconds",
            "send_timeout_seconds",
            "connect_timeout_seconds",
            "first_byte_timeout_seconds",
            "request_timeout_seconds",
            "health_check_timeout_seconds",
            "first_byte_timeout_floor_seconds",
            "min_prefill_tokens_per_second",
            "min_decode_tokens_per_second",
            "stream_idle_timeout_seconds",
            "outlier_interval_seconds",
            "outlier_base_ejection_seconds",
            "outlier_max_ejection_seconds",
            "hold_max_seconds",
            "demand_interval_seconds",
            "drain_seconds",
        ):
            value = getattr(self, name)
            need(value > 0, f"{name}={value}: must be > 0")
        need(
            0 <= self.hold_max_requests <= MAX_HELD_PER_MODEL,
            f"hold_max_requests={self.hold_max_requests}: allowed 0..{MAX_HELD_PER_MODEL} "
            "(0 turns holding off)",
        )
        if self.demand_lease is not None:
            need(
                self.discovery == "kubernetes",
                f"demand_lease={self.demand_lease!r}: needs discovery=kubernetes (the Lease "
                "is written through the same API server)",
            )
            need(
                bool(_DNS_SUBDOMAIN.match(self.demand_lease)) and len(self.demand_lease) <= 253,
                f"demand_lease={self.demand_lease!r}: not a valid object name (lower-case "
                "letters, digits, '-' and '.')",
            )
        seen: set[str] = set()  # a namespace gateway's per-model Leases and shares
        for entry in self.demand_leases:
            model, sep, lease = entry.partition("=")
            need(
                bool(sep and model) and bool(_DNS_SUBDOMAIN.match(lease)) and len(lease) <= 253
                and model not in seen,
                f"demand_leases: {entry!r}: allowed MODEL=LEASE, each model once, the Lease a "
                "valid object name (lower-case letters, digits, '-' and '.')",
            )  # fmt: skip
            seen.add(model)
        need(
            not self.demand_leases or self.discovery == "kubernetes",
            f"demand_leases={','.join(self.demand_leases)}: needs discovery=kubernetes (the "
            "Leases are written through the same API server)",
        )
        need(
            0 < self.hold_model_share <= 1,
            f"hold_model_share={self.hold_model_share}: allowed more than 0, at most 1 (the "
            "share of the held bodies' bytes one model may take)",
        )
        limit = self.max_in_flight_per_model
        need(
            limit is None or 1 <= limit <= self.max_in_flight,
            f"max_in_flight_per_model={limit}: allowed 1 to max_in_flight={self.max_in_flight}",
        )
        need(
            self.health_check_interval_seconds >= 0,
            f"health_check_interval_seconds={self.health_check_interval_seconds}: must be >= 0 "
            "(0 turns active health checks off)",
        )
        need(
            self.kv_snapshot_key_file is None or self.kv_snapshot_from is not None,
            f"kv_snapshot_key_file={self.kv_snapshot_key_file!r}: needs kv_snapshot_from "
            "(the peer the key is sent to)",
        )
        need(
            self.kv_snapshot_max_bytes <= KV_SNAPSHOT_MAX_BYTES_CAP,
            f"kv_snapshot_max_bytes={self.kv_snapshot_max_bytes}: must be <= "
            f"{KV_SNAPSHOT_MAX_BYTES_CAP} (4 GiB)",
        )
        need(
            self.kv_snapshot_timeout_seconds > 0,
            f"kv_snapshot_timeout_seconds={self.kv_snapshot_timeout_seconds}: must be > 0",
        )
        need(
            self.load_poll_interval_seconds >= 0,
            f"load_poll_interval_seconds={self.load_poll_interval_seconds}: must be >= 0 "
            "(0 turns the engine load poll off)",
        )
        problems += self._peering_problems()
        need(0 <= self.max_retries <= 10, f"max_retries={self.max_retries}: allowed 0..10")
        need(
            0 <= self.migration_limit <= 10,
            f"migration_limit={self.migration_limit}: allowed 0..10",
        )
        need(
            0 < self.outlier_failure_rate <= 1,
            f"outlier_failure_rate={self.outlier_failure_rate}: allowed (0, 1]",
        )
        for name in ("outlier_max_ejected_percent", "retry_budget_percent"):
            value = getattr(self, name)
            need(0 <= value <= 100, f"{name}={value}: allowed 0..100")
        need(self.retry_budget_min >= 0, f"retry_budget_min={self.retry_budget_min}: must be >= 0")
        need(
            self.outlier_base_ejection_seconds <= self.outlier_max_ejection_seconds,
            f"outlier_base_ejection_seconds={self.outlier_base_ejection_seconds}: must be <= "
            f"outlier_max_ejection_seconds={self.outlier_max_ejection_seconds}",
        )
        for name in (
            "health_failure_threshold",
            "health_success_threshold",
            "outlier_consecutive_failures",
            "outlier_min_requests",
        ):
            value = getattr(self, name)
            need(value >= 1, f"{name}={value}: must be >= 1")
        need(
            self.max_idle_connections_per_worker >= 0,
            f"max_idle_connections_per_worker={self.max_idle_connections_per_worker}: >= 0",
        )
        need(
            self.admin in ADMIN_MODES,
            f"admin={self.admin!r}: allowed {', '.join(ADMIN_MODES)}",
        )
        if self.admin_port is not None:
            need(
                0 <= self.admin_port <= 65535,
                f"admin_port={self.admin_port}: allowed 0..65535 (0 = any free)",
            )
            need(
                self.admin_port == 0 or self.admin_port not in (self.port, self.metrics_port),
                f"admin_port={self.admin_port}: must differ from port and metrics_port",
            )
            need(
                self.admin == "loopback",
                f"admin_port={self.admin_port}: needs admin='loopback' (the port serves the "
                f"admin API to this host without a key; admin is {self.admin!r})",
            )
        problems += _picker_problems(self)
        need(
            self.api_keys_reload_seconds > 0,
            f"api_keys_reload_seconds={self.api_keys_reload_seconds}: must be > 0",
        )
        need(
            self.admin != "keys" or self.api_keys_file is not None,
            "admin='keys': needs api_keys_file with a key whose \"admin\" is true",
        )  # the file's keys: tenancy.auth.api_keys_problems
        return problems

    def _peering_problems(self) -> list[str]:
        problems: list[str] = []
        if not 0 <= self.peer_port <= 65534:
            problems.append(
                f"peer_port={self.peer_port}: allowed 1..65534 (the port after it answers KV "
                "snapshots), or 0 (no peering)"
            )
        elif self.peer_port and {self.peer_port, snapshot_port(self.peer_port)} & {
            self.port,
            self.metrics_port,
        }:
            problems.append(
                f"peer_port={self.peer_port}: it and the port after it must differ from port "
                "and metrics_port"
            )
        for endpoint in self.peers:
            problem = peer_endpoint_problem(endpoint)
            if problem:
                problems.append(problem)
        name = self.peers_from_dns
        if name is not None and not (
            _DNS_SUBDOMAIN.match(name.lower().rstrip(".")) and len(name) <= 253
        ):
            problems.append(
                f"peers_from_dns={name!r}: not a DNS name (letters, digits, '-' and '.'), "
                "e.g. my-model-router-peers.serving.svc"
            )
        if self.peer_key_file is not None and not self.peer_port:
            problems.append(f"peer_key_file={self.peer_key_file!r}: needs peer_port (1..65534)")
        if (self.peers or name is not None) and not self.peer_port:
            problems.append(
                "peers, peers_from_dns: need peer_port (1..65534), the port peers publish on"
            )
        if not self.peers_refresh_interval_seconds > 0:
            problems.append(
                f"peers_refresh_interval_seconds={self.peers_refresh_interval_seconds}: must be > 0"
            )
        return problems  # the key file and the hosts: peering.peer_settings.peering_problems


_SIZE_FLOORS: dict[str, int] = {
    "max_request_line_bytes": 256,
    "max_header_bytes": 1024,
    "max_headers": 8,
    "max_request_bytes": 1024,
    "max_buffered_bytes": 1024,
    "max_prompt_chars": 1,
    "max_connections": 1,
    "max_in_flight": 1,
    "max_response_bytes": 1024,
    "kv_snapshot_max_bytes": 1024,
    "token_cache_bytes": 1024 * 1024,
}
"""The least each size limit may be: below these an ordinary request could not pass."""

KV_SNAPSHOT_MAX_BYTES_CAP: Final = 4 << 30
"""The most ``--kv-snapshot-max-bytes`` may be (ZMQ's MAXMSGSIZE takes a signed 64-bit size)."""


def _picker_problems(config: RouterConfig) -> list[str]:
    """What is wrong with the endpoint-picker settings (`picker`)."""
    port = config.picker_port
    if port is None:
        problems = [
            f"{name}=True: needs picker_port (the picker's gRPC port)"
            for name in ("picker_test_headers", "picker_tls")
            if getattr(config, name)
        ]
        if config.picker_token_file is not None:
            problems.append(
                f"picker_token_file={config.picker_token_file!r}: needs picker_port (the "
                "picker's gRPC port)"
            )
        problems += [
            f"{name}={getattr(config, name)}: needs picker_port (the picker's gRPC port)"
            for name in ("picker_max_in_flight", "picker_max_buffered_bytes")
            if getattr(config, name) is not None
        ]
        if config.picker_no_token:
            problems.append("picker_no_token=True: needs picker_port (the picker's gRPC port)")
        return problems
    if not 0 <= port <= 65535:
        return [f"picker_port={port}: allowed 0..65535 (0 = any free)"]
    if config.prefill or config.decode or config.pd_disaggregation:
        return [
            f"picker_port={port} (--picker-port): not allowed in PD mode "
            "(--prefill/--decode or --pd-disaggregation): a gateway sends each request to the "
            "one endpoint the picker names, and neither a prefill nor a decode engine serves a "
            "request alone (docs/pd.md); allowed: one of them, PD mode on the router's HTTP port"
        ]
    if not 1 <= config.picker_max_connections <= MAX_PICKER_CONNECTIONS:
        return [
            f"picker_max_connections={config.picker_max_connections}: allowed "
            f"1..{MAX_PICKER_CONNECTIONS} (a gateway holds a few connections per proxy)"
        ]
    per_address = config.picker_max_connections_per_address
    if not 1 <= per_address <= MAX_PICKER_CONNECTIONS:
        return [
            f"picker_max_connections_per_address={per_address}: allowed "
            f"1..{MAX_PICKER_CONNECTIONS} (at most picker_max_connections is used)"
        ]
    if not MIN_PICKER_MESSAGE_BYTES <= config.picker_max_message_bytes <= MAX_PICKER_MESSAGE_BYTES:
        return [
            f"picker_max_message_bytes={config.picker_max_message_bytes}: allowed "
            f"{MIN_PICKER_MESSAGE_BYTES}..{MAX_PICKER_MESSAGE_BYTES} (at least a headers "
            "message: 60 KiB of headers and 64 KiB of metadata; at least the gateway's largest "
            "body chunk, its per_connection_buffer_limit_bytes)"
        ]
    if config.picker_token_file is not None:
        try:
            read_token(config.picker_token_file)
        except ValueError as err:
            return [f"picker_token_file: {err}"]
        if config.picker_no_token:
            return [
                f"picker_no_token=True and picker_token_file={config.picker_token_file!r}: "
                "allowed one of them"
            ]
    elif not config.picker_no_token and not _loopback(config.host):
        return [
            f"picker_port={port} on host={config.host!r}: needs picker_token_file (the "
            "gateway's token, --picker-token-file), or picker_no_token=True "
            "(--picker-no-token: a gateway that cannot present one, its port kept to the "
            "gateway by a NetworkPolicy); a loopback host needs neither"
        ]
    limit = config.picker_max_in_flight
    if limit is not None and not 1 <= limit <= MAX_PICKER_IN_FLIGHT:
        return [f"picker_max_in_flight={limit}: allowed 1..{MAX_PICKER_IN_FLIGHT}"]
    share = config.picker_max_buffered_bytes
    room = config.max_buffered_bytes - config.max_request_bytes
    if share is not None and not config.max_request_bytes <= share <= room:
        return [
            f"picker_max_buffered_bytes={share}: allowed max_request_bytes="
            f"{config.max_request_bytes} to max_buffered_bytes - max_request_bytes={room} "
            "(the picker's share of max_buffered_bytes: one body at least, and one left to "
            "the HTTP port)"
        ]
    if share is None and config.picker_buffer_bytes() > room:
        return [
            f"max_buffered_bytes={config.max_buffered_bytes}: with picker_port, must hold a "
            f"body of max_request_bytes={config.max_request_bytes} for the picker (a quarter, "
            "picker_max_buffered_bytes) and one for the HTTP port"
        ]
    taken = {config.port, config.metrics_port, config.admin_port}
    if config.peer_port:
        taken |= {config.peer_port, snapshot_port(config.peer_port)}
    if port and port in taken:
        return [
            f"picker_port={port}: must differ from port, metrics_port, admin_port, peer_port "
            "and the port after peer_port"
        ]
    return []


def _loopback(host: str) -> bool:
    """``host`` is this host's loopback (as `worker_networks.is_loopback`, which imports
    this module)."""
    host = host.removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MAX_PICKER_CONNECTIONS: Final = 65_536
MAX_PICKER_IN_FLIGHT: Final = 1 << 20
MIN_PICKER_MESSAGE_BYTES: Final = 128 * 1024
MAX_PICKER_MESSAGE_BYTES: Final = 64 * 1024 * 1024
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


def peer_endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with a ``--peer`` value, or None; it must be ``tcp://HOST:PORT``."""
    expected = "expected tcp://HOST:PORT, e.g. tcp://10.0.0.7:8100"
    if not endpoint.startswith("tcp://"):
        return f"peer {endpoint!r}: {expected}"
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"peer {endpoint!r}: {expected} (port 1..65535)"
    if not _is_peer_host(host):
        return (
            f"peer {endpoint!r}: {host!r} is not a host (an IPv4 address, a DNS name, or an "
            f"IPv6 address in brackets); {expected}"
        )
    return None


def _is_peer_host(host: str) -> bool:
    """``host`` is an IPv4 address, a DNS name, or ``[IPv6 address]``."""
    if host.startswith("[") and host.endswith("]"):
        try:
            return isinstance(ipaddress.ip_address(host[1:-1]), ipaddress.IPv6Address)
        except ValueError:
            return False
    with contextlib.suppress(ValueError):
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    return bool(_DNS_NAME.match(host.lower().rstrip("."))) and len(host) <= 253


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


def uds_problems(path: str) -> list[str]:
    """What is wrong with ``uds`` (the front's unix socket): an absolute path of at most
    `MAX_UNIX_PATH_BYTES` bytes, in a directory that exists, not a file that is no socket."""
    if not path.startswith("/") or not path.isprintable() or path.endswith("/"):
        return [f"uds={path[:80]!r}: must be an absolute path to a socket file (/run/x.sock)"]
    if len(path.encode()) > MAX_UNIX_PATH_BYTES:
        return [f"uds={path[:80]!r}...: allowed at most {MAX_UNIX_PATH_BYTES} bytes (the kernel's)"]
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return [f"uds={path!r}: the directory {folder!r} does not exist"]
    if os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode):
        return [f"uds={path!r}: the path exists and is not a socket (it is not replaced)"]
    return []
