"""The checks a `RouterConfig`'s values alone decide (`problems`): ranges, ports, names, which
settings need which; one sentence each naming the setting, its value and what is allowed.
`tpuserve_router.validation.validate` adds what each package checks and raises. It imports
nothing of the router but `config`."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import stat
from typing import Final

from tpuserve_router.config import (
    ADMIN_MODES,
    DISCOVERY_MODES,
    ENGINE_TYPES,
    MAX_UNIX_PATH_BYTES,
    PD_POLICIES,
    RouterConfig,
    read_token,
    snapshot_port,
)

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*$")
"""A DNS name: dot-separated labels of letters, digits and '-' (not first nor last)."""
MAX_HELD_PER_MODEL = 100_000
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _pd_problems(config: RouterConfig) -> list[str]:
    problems: list[str] = []
    if bool(config.prefill) != bool(config.decode):
        problems.append(
            f"prefill={list(config.prefill)}, decode={list(config.decode)}: PD mode needs both "
            "prefill and decode workers"
        )
    if config.pd_policy not in PD_POLICIES:
        problems.append(f"pd_policy={config.pd_policy!r}: allowed {', '.join(PD_POLICIES)}")
    if config.pd_threshold_tokens is not None and config.pd_threshold_tokens < 0:
        problems.append(f"pd_threshold_tokens={config.pd_threshold_tokens}: allowed >= 0")
    if not config.pd_itl_budget_seconds > 0:
        problems.append(f"pd_itl_budget_seconds={config.pd_itl_budget_seconds}: allowed > 0")
    if not config.pd_handoff_timeout_seconds > 0:
        problems.append(
            f"pd_handoff_timeout_seconds={config.pd_handoff_timeout_seconds}: allowed > 0 "
            "(at most the engines' SGLANG_DISAGGREGATION_*_TIMEOUT)"
        )
    return problems


def problems(config: RouterConfig) -> list[str]:
    """What is wrong with the values themselves, one sentence each naming the setting;
    `tpuserve_router.validation.validate` adds what the packages check and raises."""
    problems: list[str] = _pd_problems(config)

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    need(0 <= config.port <= 65535, f"port={config.port}: allowed 0..65535 (0 = any free)")
    need(
        config.engine_type in ENGINE_TYPES,
        f"engine_type={config.engine_type!r}: allowed {', '.join(ENGINE_TYPES)}",
    )
    if config.uds is not None:
        problems += uds_problems(config.uds)
    if config.metrics_port is not None:
        need(
            0 <= config.metrics_port <= 65535,
            f"metrics_port={config.metrics_port}: allowed 0..65535",
        )
    if config.worker_port is not None:
        need(
            1 <= config.worker_port <= 65535,
            f"worker_port={config.worker_port}: allowed 1..65535",
        )
    need(
        config.discovery in DISCOVERY_MODES,
        f"discovery={config.discovery!r}: allowed {', '.join(DISCOVERY_MODES)}",
    )
    if config.discovery == "kubernetes":
        need(
            bool(config.selector),
            "selector: required with discovery=kubernetes (k=v[,k=v]), e.g. "
            "app.kubernetes.io/instance=my-model",
        )
        for key, value in config.selector.items():
            need(
                bool(_LABEL_KEY.match(key)) and len(key) <= 317,
                f"selector key {key!r}: not a valid Kubernetes label key",
            )
            need(
                bool(_LABEL_VALUE.match(value)) and len(value) <= 63,
                f"selector value {value!r} (key {key}): not a valid Kubernetes label value",
            )
        if config.leader_label:
            need(
                config.leader_label.count("=") == 1,
                f"leader_label={config.leader_label!r}: expected KEY=VALUE or empty",
            )
    elif not config.workers:
        pass  # workers may be added later through POST /workers
    for name, least in _SIZE_FLOORS.items():
        value = getattr(config, name)
        need(value >= least, f"{name}={value}: must be >= {least}")
    need(
        config.max_request_bytes <= config.max_buffered_bytes,
        f"max_request_bytes={config.max_request_bytes}: must be <= max_buffered_bytes="
        f"{config.max_buffered_bytes} (a body larger than every body the router may hold "
        "could never be read)",
    )
    share = config.max_buffered_bytes_per_client
    need(
        share is None or config.max_request_bytes <= share <= config.max_buffered_bytes,
        f"max_buffered_bytes_per_client={share}: allowed max_request_bytes="
        f"{config.max_request_bytes} to max_buffered_bytes={config.max_buffered_bytes} (one "
        "client's share must fit the largest body, and fit in the budget)",
    )
    need(
        config.max_request_line_bytes <= config.max_header_bytes,
        f"max_request_line_bytes={config.max_request_line_bytes}: must be <= "
        f"max_header_bytes={config.max_header_bytes} (the request line is part of the head)",
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
        value = getattr(config, name)
        need(value > 0, f"{name}={value}: must be > 0")
    need(
        0 <= config.hold_max_requests <= MAX_HELD_PER_MODEL,
        f"hold_max_requests={config.hold_max_requests}: allowed 0..{MAX_HELD_PER_MODEL} "
        "(0 turns holding off)",
    )
    if config.demand_lease is not None:
        need(
            config.discovery == "kubernetes",
            f"demand_lease={config.demand_lease!r}: needs discovery=kubernetes (the Lease "
            "is written through the same API server)",
        )
        need(
            bool(_DNS_SUBDOMAIN.match(config.demand_lease)) and len(config.demand_lease) <= 253,
            f"demand_lease={config.demand_lease!r}: not a valid object name (lower-case "
            "letters, digits, '-' and '.')",
        )
    seen: set[str] = set()  # a namespace gateway's per-model Leases and shares
    for entry in config.demand_leases:
        model, sep, lease = entry.partition("=")
        need(
            bool(sep and model) and bool(_DNS_SUBDOMAIN.match(lease)) and len(lease) <= 253
            and model not in seen,
            f"demand_leases: {entry!r}: allowed MODEL=LEASE, each model once, the Lease a "
            "valid object name (lower-case letters, digits, '-' and '.')",
        )  # fmt: skip
        seen.add(model)
    need(
        not config.demand_leases or config.discovery == "kubernetes",
        f"demand_leases={','.join(config.demand_leases)}: needs discovery=kubernetes (the "
        "Leases are written through the same API server)",
    )
    need(
        0 < config.hold_model_share <= 1,
        f"hold_model_share={config.hold_model_share}: allowed more than 0, at most 1 (the "
        "share of the held bodies' bytes one model may take)",
    )
    limit = config.max_in_flight_per_model
    need(
        limit is None or 1 <= limit <= config.max_in_flight,
        f"max_in_flight_per_model={limit}: allowed 1 to max_in_flight={config.max_in_flight}",
    )
    need(
        config.health_check_interval_seconds >= 0,
        f"health_check_interval_seconds={config.health_check_interval_seconds}: must be >= 0 "
        "(0 turns active health checks off)",
    )
    need(
        config.kv_snapshot_key_file is None or config.kv_snapshot_from is not None,
        f"kv_snapshot_key_file={config.kv_snapshot_key_file!r}: needs kv_snapshot_from "
        "(the peer the key is sent to)",
    )
    need(
        config.kv_snapshot_max_bytes <= KV_SNAPSHOT_MAX_BYTES_CAP,
        f"kv_snapshot_max_bytes={config.kv_snapshot_max_bytes}: must be <= "
        f"{KV_SNAPSHOT_MAX_BYTES_CAP} (4 GiB)",
    )
    need(
        config.kv_snapshot_timeout_seconds > 0,
        f"kv_snapshot_timeout_seconds={config.kv_snapshot_timeout_seconds}: must be > 0",
    )
    need(
        config.load_poll_interval_seconds >= 0,
        f"load_poll_interval_seconds={config.load_poll_interval_seconds}: must be >= 0 "
        "(0 turns the engine load poll off)",
    )
    problems += _peering_problems(config)
    need(0 <= config.max_retries <= 10, f"max_retries={config.max_retries}: allowed 0..10")
    need(
        0 <= config.migration_limit <= 10,
        f"migration_limit={config.migration_limit}: allowed 0..10",
    )
    need(
        0 < config.outlier_failure_rate <= 1,
        f"outlier_failure_rate={config.outlier_failure_rate}: allowed (0, 1]",
    )
    for name in ("outlier_max_ejected_percent", "retry_budget_percent"):
        value = getattr(config, name)
        need(0 <= value <= 100, f"{name}={value}: allowed 0..100")
    need(config.retry_budget_min >= 0, f"retry_budget_min={config.retry_budget_min}: must be >= 0")
    need(
        config.outlier_base_ejection_seconds <= config.outlier_max_ejection_seconds,
        f"outlier_base_ejection_seconds={config.outlier_base_ejection_seconds}: must be <= "
        f"outlier_max_ejection_seconds={config.outlier_max_ejection_seconds}",
    )
    for name in (
        "health_failure_threshold",
        "health_success_threshold",
        "outlier_consecutive_failures",
        "outlier_min_requests",
    ):
        value = getattr(config, name)
        need(value >= 1, f"{name}={value}: must be >= 1")
    need(
        config.max_idle_connections_per_worker >= 0,
        f"max_idle_connections_per_worker={config.max_idle_connections_per_worker}: >= 0",
    )
    need(
        config.admin in ADMIN_MODES,
        f"admin={config.admin!r}: allowed {', '.join(ADMIN_MODES)}",
    )
    if config.admin_port is not None:
        need(
            0 <= config.admin_port <= 65535,
            f"admin_port={config.admin_port}: allowed 0..65535 (0 = any free)",
        )
        need(
            config.admin_port == 0 or config.admin_port not in (config.port, config.metrics_port),
            f"admin_port={config.admin_port}: must differ from port and metrics_port",
        )
        need(
            config.admin == "loopback",
            f"admin_port={config.admin_port}: needs admin='loopback' (the port serves the "
            f"admin API to this host without a key; admin is {config.admin!r})",
        )
    problems += _picker_problems(config)
    need(
        config.api_keys_reload_seconds > 0,
        f"api_keys_reload_seconds={config.api_keys_reload_seconds}: must be > 0",
    )
    need(
        config.admin != "keys" or config.api_keys_file is not None,
        "admin='keys': needs api_keys_file with a key whose \"admin\" is true",
    )  # the file's keys: tenancy.auth.api_keys_problems
    return problems


def _peering_problems(config: RouterConfig) -> list[str]:
    problems: list[str] = []
    if not 0 <= config.peer_port <= 65534:
        problems.append(
            f"peer_port={config.peer_port}: allowed 1..65534 (the port after it answers KV "
            "snapshots), or 0 (no peering)"
        )
    elif config.peer_port and {config.peer_port, snapshot_port(config.peer_port)} & {
        config.port,
        config.metrics_port,
    }:
        problems.append(
            f"peer_port={config.peer_port}: it and the port after it must differ from port "
            "and metrics_port"
        )
    for endpoint in config.peers:
        problem = peer_endpoint_problem(endpoint)
        if problem:
            problems.append(problem)
    name = config.peers_from_dns
    if name is not None and not (
        _DNS_SUBDOMAIN.match(name.lower().rstrip(".")) and len(name) <= 253
    ):
        problems.append(
            f"peers_from_dns={name!r}: not a DNS name (letters, digits, '-' and '.'), "
            "e.g. my-model-router-peers.serving.svc"
        )
    if config.peer_key_file is not None and not config.peer_port:
        problems.append(f"peer_key_file={config.peer_key_file!r}: needs peer_port (1..65534)")
    if (config.peers or name is not None) and not config.peer_port:
        problems.append(
            "peers, peers_from_dns: need peer_port (1..65534), the port peers publish on"
        )
    if not config.peers_refresh_interval_seconds > 0:
        problems.append(
            f"peers_refresh_interval_seconds={config.peers_refresh_interval_seconds}: must be > 0"
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
