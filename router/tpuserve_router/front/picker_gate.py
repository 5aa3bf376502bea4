"""The endpoint picker's TCP front: connection caps per source address, after authentication.

gRPC's own cap (``grpc.max_allowed_incoming_connections``) is one number for the whole port,
counted before a connection says anything: 300 half-open connections from one address took
the picker's 256 and blocked 44 of 45 new gateway connections (issue 68). So the picker's
port is this gate, which relays each connection's bytes, TLS and all, to the gRPC server on a
loopback port of its own, and keeps:

- at most ``max_connections`` connections (``--picker-max-connections``); at the cap a
  newcomer takes the place of the oldest connection that has not authenticated, else it is
  closed;
- at most ``per_address`` connections per source address that have not authenticated
  (``--picker-max-connections-per-address``); past it a newcomer from that address is closed
  at once. A connection authenticates when a stream on it presents the gateway's token
  (`authenticated`, called by the picker's check): from then on it no longer counts against
  its address, so one hostile address holds at most ``per_address`` connections, and the
  gateway's authenticated connections are never evicted. Without a token
  (``--picker-no-token``, a loopback host) no connection authenticates, and every address is
  held to ``per_address``.

The gRPC server sees each relayed connection from ``127.0.0.1:<port>``; the gate knows which
client connection that port relays (`authenticated` maps it back). Every closed newcomer is
counted (``tpuserve_router_picker_connections_refused_total{reason}``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, cast

log = logging.getLogger(__name__)

HIGH_WATER_BYTES: Final = 256 * 1024
"""Bytes one side of a relay may have waiting to be written before the other side's reads
pause (the relay's whole buffer per connection is about twice this)."""
REFUSAL_REASONS: Final = ("per_address", "full")


class _Side(asyncio.Protocol):
    """One socket of a relayed connection; what it reads is written to its peer."""

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # read before the peer's socket was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=HIGH_WATER_BYTES)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
            if self.transport is not None:  # one read's worth waits; no more until connected
                self.transport.pause_reading()
            return
        peer.transport.write(data)

    def eof_received(self) -> bool | None:
        # HTTP/2 never half-closes: a side that ends ends the connection (and its count)
        self.link.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.link.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Link:
    """A client connection and its relay to the gRPC server."""

    __slots__ = ("address", "authenticated", "client", "closed", "gate", "port", "server")

    def __init__(self, gate: PickerGate, address: str) -> None:
        self.gate = gate
        self.address = address
        self.authenticated = False
        self.closed = False
        self.port = 0  # the relay's local port, as the gRPC server sees its peer
        self.client = _Side(self)
        self.server = _Side(self)
        self.client.peer = self.server
        self.server.peer = self.client

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for side in (self.client, self.server):
            if side.transport is not None:
                side.transport.close()
        self.gate.closed(self)


class PickerGate:
    """Accepts the picker's connections and relays them to its gRPC server on loopback."""

    def __init__(
        self,
        upstream_port: int,
        *,
        max_connections: int,
        per_address: int,
        count: Callable[[str], None] | None = None,
    ) -> None:
        self.upstream_port = upstream_port
        self.max_connections = max_connections
        self.per_address = per_address
        self.count = count or (lambda reason: None)
        self.links: dict[_Link, None] = {}  # oldest first
        self.unauthenticated: dict[str, int] = {}  # per source address
        self.by_port: dict[int, _Link] = {}
        self._server: asyncio.Server | None = None
        self._connecting: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port, reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    def close_listener(self) -> None:
        """Take no new connection (those open go on)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    async def stop(self) -> None:
        """Close the listener and every connection."""
        self.close_listener()
        for link in list(self.links):
            link.close()
        for task in list(self._connecting):
            task.cancel()

    def _accept(self) -> asyncio.Protocol:
        return _Accepted(self)

    def admit(self, link: _Link) -> bool:
        """Count a new connection, or refuse it (False): its address over ``per_address``
        unauthenticated connections, or the gate full with none to evict."""
        held = self.unauthenticated.get(link.address, 0)
        if held >= self.per_address:
            self.count("per_address")
            return False
        if len(self.links) >= self.max_connections:
            victim = next((v for v in self.links if not v.authenticated), None)
            if victim is None:
                self.count("full")
                return False
            victim.close()
            self.count("full")
        self.links[link] = None
        self.unauthenticated[link.address] = held + 1
        return True

    def closed(self, link: _Link) -> None:
        admitted = self.links.pop(link, 0) is None
        if admitted and not link.authenticated:
            self._release(link.address)
        if link.port:
            self.by_port.pop(link.port, None)

    def _release(self, address: str) -> None:
        left = self.unauthenticated.get(address, 0) - 1
        if left > 0:
            self.unauthenticated[address] = left
        else:
            self.unauthenticated.pop(address, None)

    def authenticated(self, peer: str) -> None:
        """A stream from gRPC's ``peer`` (``ipv4:127.0.0.1:PORT``) presented the token: its
        connection no longer counts against its address."""
        try:
            port = int(peer.rpartition(":")[2])
        except ValueError:
            return
        link = self.by_port.get(port)
        if link is None or link.authenticated or link.closed:
            return
        link.authenticated = True
        self._release(link.address)

    async def connect(self, link: _Link) -> None:
        """Open the relay to the gRPC server, then pass on what the client sent already."""
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(
                lambda: link.server, "127.0.0.1", self.upstream_port
            )
        except OSError as err:
            log.warning("picker gate: cannot reach the picker's gRPC server: %s", err)
            link.close()
            return
        if link.closed:
            transport.close()
            return
        link.port = int(transport.get_extra_info("sockname")[1])
        self.by_port[link.port] = link
        client = link.client
        pending, client.pending = client.pending, []
        for data in pending:
            transport.write(data)
        if client.transport is not None:
            client.transport.resume_reading()


class _Accepted(_Side):
    """The client's side: admitted by the gate as it connects."""

    def __init__(self, gate: PickerGate) -> None:
        self.gate = gate
        super().__init__(_Link(gate, ""))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        link = self.link
        link.address = str(peer[0]) if peer else ""
        link.client = self
        link.server.peer = self
        self.peer = link.server
        if not self.gate.admit(link):
            link.closed = True
            transport.close()
            return
        assert self.transport is not None
        self.transport.pause_reading()  # until the relay is connected
        task = asyncio.ensure_future(self.gate.connect(link))
        self.gate._connecting.add(task)
        task.add_done_callback(self.gate._connecting.discard)
