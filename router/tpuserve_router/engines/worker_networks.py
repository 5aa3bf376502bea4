"""Which addresses the router may dial: ``--worker-networks``.

Empty (the default) allows any address. When set, the router dials a worker, and its KV-event
endpoints, only if the address is an IP inside one of the networks: a discovered pod outside
them is not routed (``GET /workers`` lists it under ``rejected`` with the reason, and the
router logs it once), a ``--worker`` outside them is a start-up error, and ``POST /workers``
answers 400. Host names are refused when networks are set, since the address they resolve to
is not known in advance. A cluster can pin its pod network this way; the end-to-end tests pin
``127.0.0.0/8`` so that nothing ever dials the fake pod IPs of a kwok cluster.

What a worker names rather than what the router was given is bounded even without the flag: a
KV-event endpoint a worker's ``/server_info`` names (``kv_events_config.endpoint`` may name
any host) is dialled only at the worker's own host or inside `DEFAULT_NETWORKS` (loopback and
the private ranges pods have), never at a public or link-local address (169.254.169.254, the
metadata server) a hostile or misconfigured engine chose (issue 57, item 7); and what a
pod's annotations name (its worker URL, its KV-event endpoints) is dialled only at an IP
inside `DEFAULT_NETWORKS` (issue 68: anyone who may annotate a pod could point the router at
the metadata server; `discovery.kubernetes`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Final

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.workers import (
    InvalidWorkerURL,
    is_unix_host,
    normalize_worker_url,
    parse_worker_flag,
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDR strings as networks; raises ValueError naming the first bad value."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"worker_networks: {value!r} is not an IP network; expected CIDR such as "
                "127.0.0.0/8, 10.0.0.0/8 or fd00::/8"
            ) from None
    return tuple(networks)


DEFAULT_NETWORKS_TEXT: Final = (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
    "::1/128", "fc00::/7",
)  # fmt: skip
"""Loopback, RFC 1918, RFC 6598 (GKE may give pods these) and IPv6 unique local addresses:
where a worker's KV-event endpoints may be without ``--worker-networks``."""


def host_problem(host: str, networks: Sequence[Network]) -> str | None:
    """Why ``host`` may not be dialled, or None if it may (always None without networks)."""
    if not networks:
        return None
    allowed = ", ".join(str(n) for n in networks)
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return (
            f"host {host!r} is not an IP address; with worker_networks ({allowed}) "
            "workers are dialled by IP only"
        )
    if any(address in network for network in networks):
        return None
    return f"address {address} is outside worker_networks ({allowed})"


def url_problem(url: str, networks: Sequence[Network], *, allow_unix: bool = False) -> str | None:
    """Why the worker URL may not be dialled (bad URL, or outside ``networks``), or None.

    A ``unix:`` socket is allowed only where ``allow_unix`` says so: the router's own
    ``--worker`` flag (whoever starts the router chose the file). Discovery and the admin API
    refuse it, so that a pod annotation or an admin call cannot make the router dial any
    socket of its host. ``networks`` bound IP addresses; a socket on this host is none."""
    try:
        name, host, _ = normalize_worker_url(url, allow_unix=True)
    except InvalidWorkerURL as err:
        return str(err)
    if is_unix_host(host):
        if allow_unix:
            return None
        return (
            f"worker url {name}: a unix socket worker is allowed only on the router's command "
            "line (--worker unix:/PATH); expected http://HOST:PORT"
        )
    problem = host_problem(host, networks)
    return f"worker url {name}: {problem}" if problem else None


def endpoint_problem(endpoint: str, networks: Sequence[Network]) -> str | None:
    """Why a ``tcp://HOST:PORT`` KV-event endpoint may not be dialled, or None."""
    if not networks:
        return None
    scheme, sep, rest = endpoint.partition("://")
    host = rest.rpartition(":")[0] if sep and scheme == "tcp" else ""
    if not host:
        return f"KV-event endpoint {endpoint!r}: expected tcp://HOST:PORT"
    problem = host_problem(host, networks)
    return f"KV-event endpoint {endpoint}: {problem}" if problem else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, bracketed or not, or ``localhost``) is this host's
    loopback: a listener bound there is reachable only from this host (this pod)."""
    host = host.removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


DEFAULT_NETWORKS: Final = parse_networks(DEFAULT_NETWORKS_TEXT)


def advertised_endpoint_problem(
    endpoint: str, worker_host: str, networks: Sequence[Network]
) -> str | None:
    """Why a KV-event endpoint a worker advertised (``/server_info``) may not be dialled:
    at the worker's own host it may; elsewhere it must be inside ``networks``, or
    `DEFAULT_NETWORKS` when none were given."""
    scheme, sep, rest = endpoint.partition("://")
    host = rest.rpartition(":")[0] if sep and scheme == "tcp" else ""
    if host and host.strip("[]") == worker_host.strip("[]"):
        return None
    return endpoint_problem(endpoint, networks or DEFAULT_NETWORKS)


def worker_problems(config: RouterConfig) -> list[str]:
    """What is wrong with ``worker_networks`` and the ``--worker`` values: a network that is
    not one, a URL that is not a worker's, or an address outside the networks."""
    problems: list[str] = []
    try:
        networks = parse_networks(config.worker_networks)
    except ValueError as err:
        problems.append(str(err))
        networks = ()
    for flag in config.workers:
        try:
            url = parse_worker_flag(flag).url
        except InvalidWorkerURL as err:
            problems.append(str(err))
            continue
        problem = url_problem(url, networks, allow_unix=True)
        if problem:
            problems.append(problem)
    return problems
