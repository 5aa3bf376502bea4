"""Free TCP ports on 127.0.0.1, for components that cannot be told to bind port 0."""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """`count` distinct ports the kernel just handed out for 127.0.0.1.

    All sockets stay open until every port is chosen, so the ports are distinct; another
    process could still take one before the component binds it, which the start-up readiness
    wait then reports.
    """
    with contextlib.ExitStack() as stack:
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
    it binds P and P + 1)."""
    while True:
        port = free_port()
        if port >= 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port + 1))
            except OSError:
                continue
        return port
