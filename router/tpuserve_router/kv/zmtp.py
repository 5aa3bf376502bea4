"""A ZMTP 3.0 SUB connection over a plain TCP socket, read on the router's event loop.

libzmq reads a SUB socket on an I/O thread of its own and hands each message to the
application through a mailbox: per KV-event batch that is a wake-up of that thread, a
signal to the event loop, a wake-up of the loop and several calls to fetch the frames. On a
loaded router in front of engines publishing a batch per scheduler step, the thread alone
cost 50-60 µs per routed request (CHANGELOG.md, router CPU pass 4). A `ZmtpSubscriber` speaks
the same wire protocol (ZMTP 3.0, NULL security, rfc.zeromq.org/spec/23) from the event
loop's thread: the socket is watched only while it is idle; once data comes, the
subscriber's `SubscriberGroup` reads every busy socket at most once per ``interval``, all of
a router's streams at once and, under load, in a wake-up a request caused (before its
routing decision), so the events cost a ``recv`` and the frame parsing, and reach a decision
at most ``interval`` late. The reads and the frames are the
compiled `ZmtpReader`'s (`tpuserve_router._native`), which also applies a KV-event stream's
batches in sequence straight from them (`kv_events`): in Python, splitting, filtering and
handing on each batch's three frames cost more than applying it.

What libzmq gave for free is done here: the handshake (greeting, READY with
``Socket-Type: SUB``, the subscription as a ZMTP 3.0 subscribe message), reconnecting after a
refused or lost connection (100 ms, doubling up to 2 s), PING answered with PONG, the prefix
filter on the first frame, and bounds: a frame larger than `MAX_FRAME_BYTES` or a malformed
one ends the connection (and it reconnects); at most ``high_water_mark`` complete messages
wait unread, past which the socket is left unread (TCP pushes back, the engine's PUB queues
and then drops, and the sequence numbers show the gap). Only ``tcp://host:port`` endpoints
are read this way (the router's subscriptions to other transports keep libzmq).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Final

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router._native import ZmtpReader

log = logging.getLogger(__name__)

SIGNATURE: Final = b"\xff" + b"\x00" * 8 + b"\x7f"
GREETING: Final = SIGNATURE + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
"""Ours: ZMTP 3.0, NULL mechanism, as client (64 bytes). Version 3.0 has the subscription
sent as a message (1, then the prefix), which every ZMTP 3 publisher accepts."""
GREETING_BYTES: Final = 64
MORE: Final = 0x01
LONG: Final = 0x02
COMMAND: Final = 0x04
MAX_FRAME_BYTES: Final = 64 << 20
"""A frame's size at most, and a message's, all its frames together (a KV-event batch of a
90,000-token prompt is under 1 MB)."""
READ_BYTES: Final = 256 << 10
"""Bytes taken from the socket per ``recv``; at most `READS_PER_TURN` of them per turn."""
READS_PER_TURN: Final = 16
IDLE_TURNS: Final = 10
"""Turns of a `SubscriberGroup` a busy socket may have nothing before it is watched by the
loop again (a socket that has data every few turns is never watched: no wake-up of its own,
no ``epoll_ctl`` per batch)."""
CONNECT_TIMEOUT_SECONDS: Final = 5.0
HANDSHAKE_TIMEOUT_SECONDS: Final = 5.0
FIRST_RECONNECT_SECONDS: Final = 0.1
"""The first wait before reconnecting (libzmq's ZMQ_RECONNECT_IVL)."""
LONGEST_RECONNECT_SECONDS: Final = 2.0
"""The longest wait before reconnecting."""


class ZmtpError(Exception):
    """The peer broke the protocol (the message says how); the connection is dropped."""


def tcp_address(endpoint: str) -> tuple[str, int] | None:
    """``tcp://host:port`` (host a name, an IPv4 address or a bracketed IPv6 one) as
    (host, port); None for any other endpoint."""
    if not endpoint.startswith("tcp://"):
        return None
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host or host == "*":
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ";" in host or "[" in host or "]" in host:  # libzmq's interface form: not ours
        return None
    return host, int(port)


def command(name: bytes, body: bytes = b"") -> bytes:
    """One command frame."""
    data = bytes([len(name)]) + name + body
    if len(data) > 255:
        return bytes([COMMAND | LONG]) + len(data).to_bytes(8, "big") + data
    return bytes([COMMAND, len(data)]) + data


def ready(socket_type: bytes) -> bytes:
    """The NULL mechanism's READY command with one property, ``Socket-Type``."""
    name = b"Socket-Type"
    return command(
        b"READY", bytes([len(name)]) + name + len(socket_type).to_bytes(4, "big") + socket_type
    )


def message_frame(body: bytes) -> bytes:
    """A single-frame message."""
    if len(body) > 255:
        return bytes([LONG]) + len(body).to_bytes(8, "big") + body
    return bytes([0, len(body)]) + body


def subscription(prefix: bytes) -> bytes:
    """ZMTP 3.0's subscribe message for ``prefix``."""
    return message_frame(b"\x01" + prefix)


def check_greeting(greeting: bytes) -> None:
    """Raise `ZmtpError` unless ``greeting`` is a ZMTP 3.x greeting with the NULL mechanism."""
    if len(greeting) != GREETING_BYTES or greeting[0] != 0xFF or not greeting[9] & 0x01:
        raise ZmtpError("not a ZMTP greeting")
    if greeting[10] < 3:
        raise ZmtpError(f"ZMTP version {greeting[10]}.{greeting[11]}; 3.0 or later is needed")
    mechanism = greeting[12:32].rstrip(b"\x00")
    if mechanism != b"NULL":
        raise ZmtpError(f"security mechanism {mechanism!r}; only NULL is supported")


def _feed(reader: ZmtpReader, data: bytes) -> list[tuple[bytes, bytes]]:
    """``reader.feed(data)``, a protocol violation raised as `ZmtpError`."""
    try:
        return reader.feed(data)
    except ValueError as err:
        raise ZmtpError(str(err)) from None


def properties(body: bytes) -> dict[bytes, bytes]:
    """A READY command's metadata (after its name), by lower-cased property name."""
    out: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(body):
        size = body[pos]
        name = body[pos + 1 : pos + 1 + size]
        pos += 1 + size
        if pos + 4 > len(body):
            raise ZmtpError("truncated READY property")
        length = int.from_bytes(body[pos : pos + 4], "big")
        value = body[pos + 4 : pos + 4 + length]
        pos += 4 + length
        if len(value) != length or len(name) != size:
            raise ZmtpError("truncated READY property")
        out[name.lower()] = value
    return out


class SubscriberGroup:
    """Reads every busy `ZmtpSubscriber` of a router at most once per ``interval`` seconds,
    all in one turn of the event loop; an idle one is watched by the loop until data comes.

    A turn is taken where the loop is awake anyway: `read_if_due`, called before each routing
    decision, takes it once ``interval`` has passed since the last, so a decision sees the
    events at most ``interval`` late. A timer takes it only after ``backstop`` seconds with
    no decision (an idle router), so a loaded router's loop does not wake for turns of their
    own (0.98-0.99x its CPU per request side by side: CHANGELOG.md, router CPU pass 15)."""

    def __init__(self, interval: float, backstop: float | None = None) -> None:
        self.interval = interval
        self.backstop = interval if backstop is None else max(backstop, interval)
        self._busy: set[ZmtpSubscriber] = set()
        self._tick: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_turn = -math.inf  # loop time

    def busy(self, subscriber: ZmtpSubscriber) -> None:
        self._busy.add(subscriber)
        if self._tick is None:
            loop = self._loop
            if loop is None:
                self._loop = loop = asyncio.get_running_loop()
            self._tick = loop.call_later(self.backstop, self._read_all)

    def read_if_due(self) -> None:
        """A decision is about to be made: take the turn now if one is due. The timer is
        cancelled and armed anew after the turn: under load it never fires (a timer left
        armed would wake the loop once per ``backstop`` for nothing)."""
        tick, loop = self._tick, self._loop
        if tick is not None and loop is not None and loop.time() - self._last_turn >= self.interval:
            tick.cancel()
            self._read_all()

    def discard(self, subscriber: ZmtpSubscriber) -> None:
        self._busy.discard(subscriber)

    def _read_all(self) -> None:
        self._tick = None
        loop = self._loop
        assert loop is not None
        self._last_turn = loop.time()
        try:
            for subscriber in list(self._busy):
                try:
                    if subscriber.read_turn():
                        subscriber.idle_turns = 0
                        continue
                except Exception:  # a bug in one stream must not stall the others
                    log.exception("%s: reading KV events failed", subscriber.label)
                subscriber.idle_turns += 1
                if subscriber.idle_turns >= IDLE_TURNS:
                    self._busy.discard(subscriber)
                    subscriber.watch()
        finally:
            if self._busy:
                self._tick = loop.call_later(self.backstop, self._read_all)

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self._busy.clear()


class ZmtpSubscriber:
    """One SUB connection to a PUB endpoint, kept up until `close`.

    ``on_connected`` runs (awaited) once each connection's handshake is done; the stream
    is read meanwhile, up to ``high_water_mark`` messages, and handed on after it.
    ``on_disconnected`` runs (awaited) when an established connection is lost, before
    reconnecting; what the lost connection had not handed on is dropped (the stream is
    resynced). ``on_messages`` is called whenever complete messages are waiting in `pending`
    (it takes what it can; what it leaves is offered again at the next read). `pending` is
    the connection's `ZmtpReader` (compiled): it splits the frames, keeps the messages with
    our prefix (``len``, ``popleft``, ``clear``), and can apply a KV-event stream's next
    batches to a block index where they lie (``apply_in_order``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        prefix: bytes,
        group: SubscriberGroup,
        on_connected: Callable[[], Awaitable[None]],
        on_disconnected: Callable[[], Awaitable[None]],
        on_messages: Callable[[], None],
        high_water_mark: int,
        label: str,
    ) -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self.group = group
        self.on_connected, self.on_disconnected = on_connected, on_disconnected
        self.on_messages = on_messages
        self.high_water_mark = high_water_mark
        self.label = label
        self.pending = ZmtpReader(prefix, MAX_FRAME_BYTES)
        self.connected = False  # handshake done, not yet lost
        self._sock: socket.socket | None = None
        self._watching = False
        self.idle_turns = 0  # the group's turns in a row that found nothing to read
        self.turns = 0  # `read_turn` calls: a reader spinning on a dead socket shows here
        self._holding = False  # `on_connected` is running: nothing is handed on
        self._lost: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        self._task = None
        self._drop()

    async def _run(self) -> None:
        """Connect, hold the connection until it is lost, wait, again; until cancelled. The
        wait doubles from `FIRST_RECONNECT_SECONDS` to `LONGEST_RECONNECT_SECONDS` after a
        failed attempt and after a connection that lasted less than the longest wait (a peer
        that drops us at once must not be reconnected, and replayed from, ten times a
        second)."""
        delay = FIRST_RECONNECT_SECONDS
        while True:
            try:
                await self._connect()
            except Exception as err:  # whatever it was (a bad host name too): try again later
                self._drop()
                if isinstance(err, (OSError, ZmtpError, TimeoutError)):
                    log.debug("%s: KV-event connection failed: %s", self.label, err)
                else:
                    log.warning("%s: KV-event connection failed: %r", self.label, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, LONGEST_RECONNECT_SECONDS)
                continue
            started = asyncio.get_running_loop().time()
            await self._hold()
            lasted = asyncio.get_running_loop().time() - started
            delay = FIRST_RECONNECT_SECONDS if lasted >= LONGEST_RECONNECT_SECONDS else delay
            await asyncio.sleep(delay)
            delay = min(delay * 2, LONGEST_RECONNECT_SECONDS)

    async def _hold(self) -> None:
        """Read a connection whose handshake is done until it is lost; then its end is told."""
        self.connected = True
        lost = self._lost = asyncio.Event()
        try:
            self._holding = True  # read on while it is handled (libzmq's queue, bounded)
            self._readable()
            try:
                await self.on_connected()
            except Exception:  # a bug must not end the subscription
                log.exception("%s: handling the KV-event connection failed", self.label)
            finally:
                self._holding = False
            self._deliver()  # what came meanwhile
            await lost.wait()
        finally:
            self.connected = False
            self._drop()
            self.pending.clear()  # the stream is over: what was not taken is resynced
        try:
            await self.on_disconnected()
        except Exception:  # a bug must not end the subscription
            log.exception("%s: handling the lost KV-event connection failed", self.label)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            failure: OSError = OSError(f"{self.host}: no address")
            for family, kind, proto, _, address in infos:
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                self._sock = sock
                try:
                    await loop.sock_connect(sock, address)
                    break
                except OSError as err:
                    failure = err
                    self._drop()
            else:
                raise failure
        assert self._sock is not None
        sock = self._sock
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_SECONDS):
            await loop.sock_sendall(sock, GREETING)
            check_greeting(await self._receive_exactly(GREETING_BYTES))
            await loop.sock_sendall(sock, ready(b"SUB"))
            commands: list[tuple[bytes, bytes]] = []
            while not commands:
                data = await loop.sock_recv(sock, 4096)
                if not data:
                    raise ZmtpError("the publisher closed the connection during the handshake")
                commands += _feed(self.pending, data)
            name, body = commands.pop(0)
            if name == b"ERROR":
                raise ZmtpError(f"the publisher refused us: {body[1:]!r}")
            if name != b"READY":
                raise ZmtpError(f"expected READY, got {name!r}")
            kind_of_peer = properties(body).get(b"socket-type")
            if kind_of_peer not in (b"PUB", b"XPUB"):
                raise ZmtpError(f"the peer is a {kind_of_peer!r} socket, not a publisher")
            await loop.sock_sendall(sock, subscription(self.prefix))
            self._answer(commands)

    async def _receive_exactly(self, size: int) -> bytes:
        assert self._sock is not None
        assert self._loop is not None
        data = b""
        while len(data) < size:
            chunk = await self._loop.sock_recv(self._sock, size - len(data))
            if not chunk:
                raise ZmtpError("the peer closed the connection during the handshake")
            data += chunk
        return data

    def watch(self) -> None:
        """Have the loop call us when the idle socket has data."""
        if self._sock is not None and self.connected and not self._watching:
            assert self._loop is not None
            self._loop.add_reader(self._sock.fileno(), self._readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching and self._sock is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._sock.fileno())
        self._watching = False

    def _readable(self) -> None:
        self._unwatch()
        self.idle_turns = 0
        if self.read_turn():
            self.group.busy(self)
        else:
            self.watch()

    def read_turn(self) -> bool:
        """Read what the socket has (unless `high_water_mark` messages wait), hand complete
        messages on; whether the socket is still worth reading on the group's next turn."""
        self.turns += 1
        sock = self._sock
        if sock is None or not self.connected:
            return False
        read_any = full = False
        try:
            for _ in range(READS_PER_TURN):
                if len(self.pending) >= self.high_water_mark:
                    full = True
                    break
                try:
                    size, commands = self.pending.receive(sock.fileno(), READ_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                except ValueError as violation:  # the reader's word for a protocol violation
                    raise ZmtpError(str(violation)) from None
                if not size:
                    raise ConnectionResetError("the publisher closed the connection")
                read_any = True
                if commands:
                    self._answer(commands)
                if size < READ_BYTES:
                    break  # the socket had no more: no recv to hear it say so (EAGAIN)
        except (OSError, ZmtpError) as err:
            log.info("%s: KV-event connection lost: %s", self.label, err)
            self._lose()
            return False
        self._deliver()
        return read_any or full or bool(self.pending)

    def _answer(self, commands: list[tuple[bytes, bytes]]) -> None:
        """Answer the publisher's commands (PING with PONG; ERROR ends the connection)."""
        for name, body in commands:
            if name == b"PING" and self._sock is not None:
                pong = command(b"PONG", body[2:18])  # the context, after the 2-byte TTL
                try:
                    sent = self._sock.send(pong)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                if sent != len(pong):  # a few bytes on a socket we never write otherwise
                    raise ZmtpError("could not answer the publisher's PING")
            elif name == b"ERROR":
                raise ZmtpError(f"the publisher sent ERROR: {body[1:]!r}")

    def _deliver(self) -> None:
        if self.pending and not self._holding:
            self.on_messages()

    def _lose(self) -> None:
        """The connection is over: nothing more is read or handed on from it (the stream is
        resynced), and `_hold` is woken to tell so."""
        self.connected = False
        self.pending.clear()
        self.group.discard(self)
        self._unwatch()
        if self._lost is not None:
            self._lost.set()

    def _drop(self) -> None:
        self.group.discard(self)
        self._unwatch()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.pending = ZmtpReader(self.prefix, MAX_FRAME_BYTES)
