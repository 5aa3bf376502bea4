"""Free TCP ports on 127.0.0.1, for components that cannot be told to bind port 0."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free on 127.0.0.1 just now.

    They are taken below the kernel's ephemeral range when there is room: a port inside it
    can go to any outgoing connection or port-0 bind (a ZMQ peer's, an HTTP client's) between
    this check and the component's bind, which under load happened in CI. Another process
    could still bind one on purpose first, which the start-up readiness wait then reports.
    """
    low = _ephemeral_low()
    chosen: list[int] = []
    candidates = random.SystemRandom()
    for _ in range(100 * count if low > _FLOOR + count else 0):
        port = candidates.randrange(_FLOOR, low)
        if port not in chosen and _bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    with contextlib.ExitStack() as stack:  # no room below the range: the kernel's choice
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port() -> int:
    return free_ports(1)[0]


def free_port_pair() -> int:
    """A port P such that P and P + 1 were both free on 127.0.0.1 (a router's --peer-port:
    it binds P and P + 1).

    P is taken below the kernel's ephemeral range when there is room: inside it, P + 1 could
    go to any outgoing connection or port-0 bind (another router's, a ZMQ peer's) between
    this check and the router's bind."""
    low = _ephemeral_low()
    candidates = random.SystemRandom()
    for _ in range(1000 if low > _FLOOR + 2 else 0):
        port = candidates.randrange(_FLOOR, low - 1)
        if _bindable(port) and _bindable(port + 1):
            return port
    while True:
        port = free_port()
        if port < 65535 and _bindable(port + 1):
            return port


_FLOOR = 20000
"""Where the ports are looked for (well above the well-known ports and those system services
tend to use)."""


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True
