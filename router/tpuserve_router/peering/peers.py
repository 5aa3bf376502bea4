"""Peering between router replicas over ZMQ: a PUB socket out, one SUB socket per peer in.

With ``--peer-port PORT`` the router binds a PUB socket on ``tcp://HOST:PORT`` (``HOST`` as
``--host``; ``0.0.0.0`` binds every address) and publishes there what its `PeerLink` says
(`peer_view`: each decision, first byte and end, and a hello every second). It connects a SUB
socket to each peer: the ``--peer`` endpoints, and ``tcp://ADDR:PORT`` for every address
``--peers-from-dns NAME`` resolves to (a headless Service; only those of ``--host``'s
family when it has both, `same_family`), resolved again every ``--peers-refresh-interval``
seconds. One socket per peer, so the router knows which peers'
messages came over a connection: when the socket's monitor sees it drop, those peers'
entries are dropped at once (a peer that restarts comes back as a new router id). A peer
resolving to this router itself is harmless: its own messages are recognised and ignored,
and such a connection is not counted in ``tpuserve_router_peers``.

With ``--peer-key-file`` every peering socket needs the replicas' shared key (CURVE,
`peer_auth`): a client without it reads nothing.

Bounds: the PUB socket's high-water mark (`high_water_mark`: every message of
``--max-in-flight`` requests per peer; ZMQ drops beyond it rather than block the router), the
SUB's, and ``MAXMSGSIZE`` (`peer_view.MAX_MESSAGE_BYTES`). Both ends send ZMTP heartbeats
(`keep_alive`): a peer that stops answering for 5 s (hung, SIGSTOPped) is disconnected, so
its requests drop here and nothing more queues for it there. A message that cannot be read is
counted (``tpuserve_router_peer_messages_total{kind="malformed"}``), logged once per peer
endpoint, and skipped. Reading is done on the socket's descriptor without awaiting, a bounded
number of messages per wake-up (`DRAIN_MAX_MESSAGES`), as the KV-event subscriber does; a
connection that drops has what it queued applied first, then its peers' requests dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.engines.worker_networks import is_loopback
from tpuserve_router.kv.zmq_monitor import stop_monitor
from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.peering.peer_auth import PeerGate, PeerKey
from tpuserve_router.peering.peer_view import (
    HELLO_SECONDS,
    KINDS,
    MAX_MESSAGE_BYTES,
    SILENT_SECONDS,
    PeerLink,
    PeerMessage,
    PeerMessageError,
    PeerView,
    decode,
    encode,
)

log = logging.getLogger(__name__)

MESSAGES_PER_REQUEST: Final = 3  # route, first byte, end
HWM_SLACK: Final = 64  # hellos
HEARTBEAT_MS: Final = int(HELLO_SECONDS * 1000)
HEARTBEAT_TIMEOUT_MS: Final = int(SILENT_SECONDS * 1000)
DRAIN_MAX_MESSAGES: Final = 256
RESOLVE_TIMEOUT_SECONDS: Final = 5.0  # the start waits for the first resolution (snapshots)


def peer_endpoint(host: str, port: int) -> str:
    """``tcp://HOST:PORT`` (an IPv6 address in brackets)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


async def resolve_addresses(name: str, port: int) -> list[str]:
    """The addresses ``name`` resolves to (raises OSError when it does not)."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def high_water_mark(max_open_per_peer: int) -> int:
    """Messages a PUB socket queues per peer, or a SUB socket from its peer, at most: every
    message of as many requests as a peer may have open here (`PeerView.max_open_per_peer`,
    ``--max-in-flight``), so the bound follows the router's own, in requests not bytes."""
    return MESSAGES_PER_REQUEST * max_open_per_peer + HWM_SLACK


def keep_alive(socket: zmq.Socket[Any]) -> None:
    """ZMTP heartbeats on a peering socket: a peer that stops answering (hung, stopped, its
    host gone without a reset) is disconnected after `HEARTBEAT_TIMEOUT_MS`, and its queue
    freed, instead of holding its TCP connection, and the messages queued for it, forever."""
    socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    socket.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


def same_family(addresses: list[str], host: str) -> list[str]:
    """Those of ``addresses`` in ``--host``'s family (IPv6 when it has a colon), or all when
    none is: a dual-stack name's A and AAAA records are the same peers, and following both
    would count each peer's requests over two connections (one drop wiping them while the
    other is up)."""
    ipv6 = ":" in host
    return [a for a in addresses if (":" in a) == ipv6] or addresses


def bind_endpoint(host: str, port: int) -> str:
    """Where the PUB socket binds, following ``--host`` (``0.0.0.0``, ``::`` or empty: all)."""
    if host in ("", "0.0.0.0", "::", "*"):
        return f"tcp://*:{port}"
    return peer_endpoint(host, port)


def bind_or_refuse(
    socket: zmq.Socket[Any], host: str, port: int, peer_port: int, what: str
) -> None:
    """Bind ``socket`` on ``port`` where ``--host`` says; one it cannot bind is closed and
    an OSError names ``--peer-port`` and what the port is for (the start stops on it)."""
    if ":" in host:
        socket.setsockopt(zmq.IPV6, 1)
    endpoint = bind_endpoint(host, port)
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as err:
        socket.close(linger=0)
        raise OSError(f"--peer-port {peer_port}: cannot {what} on {endpoint}: {err}") from None


class _Subscription:
    """The SUB socket to one peer endpoint and the peers heard over it."""

    def __init__(self, network: PeerNetwork, endpoint: str) -> None:
        self.network = network
        self.endpoint = endpoint
        self.routers: set[str] = set()
        self.connected = False
        self.is_self = False
        self._logged = False
        ctx = network.context
        self.socket = ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, high_water_mark(network.view.max_open_per_peer))
        keep_alive(self.socket)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if ":" in endpoint.removeprefix("tcp://").rsplit(":", 1)[0]:
            self.socket.setsockopt(zmq.IPV6, 1)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        if network.key is not None:
            network.key.dial(self.socket)
        # up once the ZMTP handshake succeeded: a stopped process's kernel still accepts TCP
        monitor = self.socket.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
        )
        self.socket.connect(endpoint)
        self.drain: zmq.Socket[bytes] = zmq.Socket.shadow(self.socket.underlying)  # no futures
        self.fd = int(self.drain.getsockopt(zmq.FD))
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.fd, self._read)
        self.loop.call_soon(self._read)
        self.monitor_task = self.loop.create_task(self._watch(monitor))
        self._stopped = False

    async def stop(self) -> None:
        self._stopped = True
        self.loop.remove_reader(self.fd)
        await cancel_and_wait([self.monitor_task])
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        self.socket.close(linger=0)
        self._forget()

    def _forget(self) -> None:
        """The connection is gone: so are the requests of the peers heard over it."""
        for router in self.routers:
            dropped = self.network.view.drop(router)
            log.info("peer %s (%s) gone: %d requests dropped", router, self.endpoint, dropped)
        self.routers.clear()

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.connected = True
                elif event["event"] == zmq.EVENT_DISCONNECTED:
                    self.connected = False
                    # what the connection queued first: a route read after the drop would
                    # come back with its end lost
                    while self._take(DRAIN_MAX_MESSAGES):
                        pass
                    self._forget()
                self.network.count_peers()
        finally:
            stop_monitor(self.socket, monitor)

    def _read(self) -> None:
        """Apply what is queued on the socket without awaiting (the descriptor is
        edge-triggered: read until nothing is left, or reschedule)."""
        if self._stopped:
            return
        if self._take(DRAIN_MAX_MESSAGES):
            self.loop.call_soon(self._read)

    def _take(self, most: int) -> bool:
        """Apply up to ``most`` queued messages; True if more may be queued."""
        drain = self.drain
        network = self.network
        for _ in range(most):
            try:
                if not int(drain.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return False
                raw = drain.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return False  # closed under us (stopping)
            try:
                message = decode(raw)
            except PeerMessageError as err:
                network.malformed.inc()
                if not self._logged:
                    self._logged = True
                    log.warning(
                        "peer %s sent a message this router cannot read (%s); skipped, "
                        "further ones are only counted",
                        self.endpoint,
                        err,
                    )
                continue
            try:
                applied = network.view.apply(message)
            except Exception:  # a bug must not end the subscription
                log.exception("peer %s: could not apply a %s message", self.endpoint, message.kind)
                continue
            if not applied:
                if not self.is_self:
                    self.is_self = True
                    network.count_peers()
                continue
            self.routers.add(message.router)
            network.received[message.kind].inc()
        return True


class PeerNetwork:
    """Owns the PUB socket, the SUB sockets, the hello task and the DNS refresh task;
    ``link`` is what the forwarder tells the peers through (nothing is sent before
    `start`)."""

    def __init__(
        self,
        view: PeerView,
        metrics: RouterMetrics,
        *,
        host: str,
        port: int,
        peers: Sequence[str] = (),
        dns_name: str | None = None,
        refresh_seconds: float = 5.0,
        addresses: Callable[[str, int], Awaitable[list[str]]] = resolve_addresses,
        key: PeerKey | None = None,
    ) -> None:
        self.view = view
        self.key = key
        self.link = PeerLink(view.router, self.publish)
        self.metrics = metrics
        self.host = host
        self.port = port
        self.static = tuple(dict.fromkeys(peers))
        self.dns_name = dns_name
        self.refresh_seconds = refresh_seconds
        self.addresses = addresses
        self.context = zmq.asyncio.Context()
        self._gate = PeerGate(self.context, key) if key is not None else None
        self.subscriptions: dict[str, _Subscription] = {}
        self.received = {kind: metrics.peer_messages.labels(kind) for kind in KINDS}
        self.malformed = metrics.peer_messages.labels("malformed")
        self._pub_socket: zmq.asyncio.Socket | None = None
        self._pub: zmq.Socket[bytes] | None = None  # the same socket, sent on without futures
        self._tasks: list[asyncio.Task[None]] = []
        self._dns_logged = False
        self._unreachable_logged = False

    async def start(self) -> None:
        self._pub_socket = self.context.socket(zmq.PUB)
        pub: zmq.Socket[bytes] = zmq.Socket.shadow(self._pub_socket.underlying)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, high_water_mark(self.view.max_open_per_peer))
        keep_alive(pub)
        if self.key is not None and self._gate is not None:
            self._gate.start()  # before the first peer's handshake
            self.key.serve(pub)
        bind_or_refuse(self._pub_socket, self.host, self.port, self.port, "publish")
        self._pub = pub
        for endpoint in self.static:
            self._subscribe(endpoint)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._hello()))
        if self.dns_name is not None:
            await self.resolve()
            self._tasks.append(loop.create_task(self._refresh()))
        self.count_peers()
        log.info(
            "peering: publishing on %s, router id %s, peers %s",
            bind_endpoint(self.host, self.port),
            self.link.router,
            ", ".join(self.subscriptions) or "none yet",
        )

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        for endpoint in list(self.subscriptions):
            await self._unsubscribe(endpoint)
        self._pub = None
        if self._pub_socket is not None:
            self._pub_socket.close(linger=0)
            self._pub_socket = None
        if self._gate is not None:
            self._gate.stop()
        self.context.term()

    def publish(self, message: PeerMessage) -> None:
        pub = self._pub
        if pub is None:
            return
        try:
            pub.send(encode(message), zmq.NOBLOCK)
        except zmq.ZMQError as err:  # past the high-water mark: peers will expire it
            log.debug("peer message not sent: %s", err)

    def count_peers(self) -> None:
        """Set ``tpuserve_router_peers``: connections up to a peer other than this router."""
        up = sum(1 for s in self.subscriptions.values() if s.connected and not s.is_self)
        self.metrics.peers.labels().set(up)

    def _subscribe(self, endpoint: str) -> None:
        if endpoint not in self.subscriptions:
            self.subscriptions[endpoint] = _Subscription(self, endpoint)

    async def _unsubscribe(self, endpoint: str) -> None:
        subscription = self.subscriptions.pop(endpoint, None)
        if subscription is not None:
            await subscription.stop()

    async def resolve(self) -> None:
        """Subscribe to every address ``dns_name`` resolves to (and the static peers), and
        stop following addresses it no longer returns. A failed lookup changes nothing."""
        name = self.dns_name
        if name is None:
            return
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_SECONDS):
                addresses = await self.addresses(name, self.port)
        except OSError as err:  # TimeoutError too
            if not self._dns_logged:
                self._dns_logged = True
                log.warning("peers: cannot resolve %s (%s); keeping the peers known", name, err)
            return
        self._dns_logged = False
        addresses = same_family(addresses, self.host)
        self._warn_if_unreachable(name, addresses)
        wanted = {peer_endpoint(address, self.port) for address in addresses}
        wanted.update(self.static)
        for endpoint in sorted(wanted - set(self.subscriptions)):
            self._subscribe(endpoint)
        for endpoint in set(self.subscriptions) - wanted:
            await self._unsubscribe(endpoint)
        self.count_peers()

    def _warn_if_unreachable(self, name: str, addresses: list[str]) -> None:
        """A loopback ``--host`` cannot be reached from peers on other hosts (the operator's
        `0.0.0.0` can); said once, as it is known only when the name resolves."""
        if self._unreachable_logged or not is_loopback(self.host):
            return
        remote = [address for address in addresses if not is_loopback(address)]
        if remote:
            self._unreachable_logged = True
            log.warning(
                "peers: %s resolves to addresses on other hosts (%s), but --host %s is a "
                "loopback address they cannot reach: they will not hear this replica; "
                "use --host 0.0.0.0 or ::",
                name, ", ".join(remote[:4]), self.host,
            )  # fmt: skip

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_seconds)
            try:
                await self.resolve()
            except Exception:  # a bug must not end the refresh
                log.exception("peers: refreshing %s failed", self.dns_name)

    async def _hello(self) -> None:
        while True:
            try:
                self.link.hello()
                for router, dropped in self.view.expire():
                    log.info("peer %s silent: %d requests dropped", router, dropped)
            except Exception:  # a bug must not end the hellos
                log.exception("peers: hello failed")
            await asyncio.sleep(HELLO_SECONDS)
