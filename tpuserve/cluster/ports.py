"""Free TCP ports on 127.0.0.1, for components that cannot be told to bind port 0.

A port is free when it is checked and taken by its component only later (a server starts in
seconds, a real SGLang engine in up to a minute on a loaded machine). Three kinds of process
could take it in between, and each is kept out:

- **the kernel**: an outgoing connection or a port-0 bind gets a port from the ephemeral
  range (``/proc/sys/net/ipv4/ip_local_port_range``); ports are chosen below it;
- **SGLang**: each engine picks its torch.distributed rendezvous port (`--nccl-port` when not
  given) in 22000-29999 with the same check-then-bind-later
  (``sglang.srt.utils.network.get_free_port_below_ephemeral``, 0.5.23), and binds it on
  0.0.0.0 only after it loaded its model; that range is left out
  (`tests/component/real_sglang/test_sglang_port_range.py` reads SGLang's own);
- **another process choosing here** (a parallel test worker, a second `tpuserve up`): each
  chosen port is reserved for ``RESERVATION_SECONDS`` in a directory all of them share, under
  a file lock, and no chooser hands out a reserved port.

Found under load in CI: a launched engine's HTTP port was an older engine's rendezvous port by
then, and its readiness probe hung on a socket that accepted and never answered.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"

RESERVATION_SECONDS = 600.0
"""How long a chosen port stays reserved: longer than any component here takes to bind it."""

SGLANG_RENDEZVOUS_PORTS = range(22000, 30000)
"""Where SGLang picks an engine's rendezvous port (`get_free_port_below_ephemeral`'s default
``low=22000, high=29999``)."""

_FLOOR = 20000
"""Where the ports are looked for (well above the well-known ports and those system services
tend to use)."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free on 127.0.0.1 just now, reserved for this caller."""
    with _reservations() as reserved:
        chosen: list[int] = []
        for port in _candidates(count):
            if port not in reserved and _bindable(port):
                reserved.add(port)
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
    it binds P and P + 1), both reserved for this caller."""
    with _reservations() as reserved:
        for port in _candidates(10):
            pair = (port, port + 1)
            if (
                port + 1 in _PORTS
                and not any(p in reserved for p in pair)
                and all(_bindable(p) for p in pair)
            ):
                for p in pair:
                    reserved.add(p)
                return port
    while True:  # no room below the range: next to the kernel's choice
        port = free_port()
        if port < 65535 and _bindable(port + 1):
            return port


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_PORTS = frozenset(range(_FLOOR, _ephemeral_low())) - frozenset(SGLANG_RENDEZVOUS_PORTS)
"""The ports looked in: from the floor to the ephemeral range, less SGLang's."""
_ORDERED = sorted(_PORTS)


def _candidates(count: int) -> list[int]:
    """Up to 100 tries a port wanted, in random order; none when the range has no room."""
    if len(_ORDERED) < 2 * count:
        return []
    return random.SystemRandom().sample(_ORDERED, min(len(_ORDERED), 100 * count))


class _Reserved:
    """The ports reserved by anyone on this machine in the last `RESERVATION_SECONDS`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        now = time.time()
        self.ports: set[int] = set()
        for path in directory.iterdir():
            if not path.name.isdigit():
                continue
            try:
                if now - path.stat().st_mtime > RESERVATION_SECONDS:
                    path.unlink()
                else:
                    self.ports.add(int(path.name))
            except FileNotFoundError:
                pass

    def __contains__(self, port: object) -> bool:
        return port in self.ports

    def add(self, port: int) -> None:
        (self.directory / str(port)).touch()
        self.ports.add(port)


@contextlib.contextmanager
def _reservations() -> Iterator[_Reserved]:
    """The reservations, held under the directory's lock while the caller chooses."""
    directory = Path(tempfile.gettempdir()) / f"tpuserve-ports-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    with (directory / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield _Reserved(directory)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True
