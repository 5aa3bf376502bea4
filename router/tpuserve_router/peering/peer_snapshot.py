"""KV snapshots between router replicas over peering: a replica started late asks its peers.

With ``--peer-port P`` the router also binds a ZMQ ROUTER socket on port ``P + 1``
(`config.snapshot_port`) and answers there with its block index (`kv_snapshot.snapshot_of`,
built on the event loop, linear in the index's size, then packed with msgpack off it). The
packed snapshot is kept for `CACHE_SECONDS` and given to every asker meanwhile, so however
many ask, the index is built and packed at most once per `CACHE_SECONDS`. A starting router
with peers asks them all at once, before it subscribes to any engine, and seeds its index from
the first snapshot it can read (`SnapshotService.take_from`), waiting at most
``--kv-snapshot-timeout`` seconds in all. With ``--peer-key-file`` both ends need the
replicas' shared key (CURVE, `peer_auth`), whatever the asker's address; the port is also
fenced to the server's own routers by the operator's NetworkPolicy. A snapshot holds block
hashes, no prompt text.

Wire (a REQ socket asks, the ROUTER answers): the request is `REQUEST` and the most bytes
the asker takes (decimal ASCII); the answer is `SNAPSHOT` and the msgpack snapshot (opaque
here: `kv_snapshot.Seeds.take` reads it, after `unpack_snapshot`), `NONE` when this router has
nothing to give (it follows no KV events, or has not heard any batch yet: a replica just
started), `TOO_LARGE` and the snapshot's size in bytes, or `UNKNOWN` for a request it cannot
read. The asker also sets ``MAXMSGSIZE``, so a peer ignoring the bound is cut off rather
than read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgpack
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.config import snapshot_port
from tpuserve_router.kv.zmq_monitor import stop_monitor
from tpuserve_router.peering.peer_auth import PeerGate, PeerKey
from tpuserve_router.peering.peers import bind_or_refuse, peer_endpoint

log = logging.getLogger(__name__)

REQUEST: Final = b"kv-snapshot/1"
SNAPSHOT: Final = b"snapshot"
NONE: Final = b"none"
TOO_LARGE: Final = b"too-large"
UNKNOWN: Final = b"unknown"
MAX_REQUEST_BYTES: Final = 1024
"""The most a snapshot request may take (with ``--peer-key-file``, a CURVE handshake command
too: INITIATE takes about 300 bytes)."""
CONNECT_SECONDS: Final = 1.0
"""How long a starting replica waits for a peer's snapshot port to accept a connection when
the peer's host neither accepts nor refuses it (a port that is not bound refuses at once, and
that peer is passed over at once): a peer not up by then is starting too (replicas installed
together) and has nothing to give, so a start never waits ``--kv-snapshot-timeout`` for
replicas that are not there yet."""
NOT_UP_REFUSED: Final = "its snapshot port refused the connection"
"""What the log says of a peer whose snapshot port is not bound yet: passed over at once, so
replicas installed together are ready without waiting for each other."""
CACHE_SECONDS: Final = 5.0
"""How long a packed snapshot is given to askers before the index is built and packed anew."""


class PeerNotUp(Exception):
    """A peer's snapshot port took no connection: the peer is not up (yet)."""


async def _connected(monitor: Any, seconds: float) -> bool | None:
    """Whether ``monitor``'s socket connected: True once it did, False as soon as the peer
    refused the connection (its port is not bound: libzmq retries, and says so), None when
    neither happened within ``seconds`` (a host that does not answer)."""
    try:
        async with asyncio.timeout(seconds):
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_CONNECTED:
                    return True
                if event["event"] == zmq.EVENT_CONNECT_RETRIED:
                    return False
    except TimeoutError:
        return None


class SnapshotError(Exception):
    """A peer's answer that gives no snapshot, said as one sentence."""


def snapshot_endpoint(endpoint: str) -> str:
    """A peer's snapshot endpoint from its peering endpoint ``tcp://HOST:PORT``."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return peer_endpoint(host.removeprefix("[").removesuffix("]"), snapshot_port(int(port)))


def request_frames(max_bytes: int) -> list[bytes]:
    return [REQUEST, str(max_bytes).encode()]


def asked_bound(frames: Sequence[bytes]) -> int | None:
    """The most bytes a request's asker takes, or None when the request cannot be read."""
    if len(frames) != 2 or frames[0] != REQUEST or not frames[1].isdigit():
        return None
    return int(frames[1])


def answer_body(frames: Sequence[bytes]) -> bytes | None:
    """The packed snapshot an answer carries, None for `NONE`; SnapshotError otherwise."""
    status = frames[0] if frames else b""
    if status == SNAPSHOT and len(frames) == 2:
        return frames[1]
    if status == NONE and len(frames) == 1:
        return None
    if status == TOO_LARGE and len(frames) == 2:
        size = frames[1].decode(errors="replace")
        raise SnapshotError(f"its snapshot is {size} bytes, above --kv-snapshot-max-bytes")
    shown = [frame[:40] for frame in frames[:3]]
    raise SnapshotError(f"an answer this router cannot read ({len(frames)} frames: {shown})")


def unpack_snapshot(body: bytes) -> Any:
    """A packed snapshot read back; ValueError for bytes that are not one (msgpack raises
    TypeError, not an UnpackException, for a map keyed by an array or a map)."""
    try:
        return msgpack.unpackb(body, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise ValueError(f"not a msgpack snapshot: {err!r}") from None


class SnapshotService:
    """Owns the ROUTER socket answering peers and its task; asks peers in `take_from`."""

    def __init__(
        self,
        give: Callable[[], dict[str, Any] | None],
        *,
        host: str,
        port: int,
        timeout_seconds: float,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        key: PeerKey | None = None,
    ) -> None:
        self.give = give
        self.key = key
        self.host = host
        self.port = port
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes
        self.context = zmq.asyncio.Context()
        self._gate = PeerGate(self.context, key) if key is not None else None
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._clock = clock
        self._packed: tuple[float, bytes | None] | None = None  # (packed at, the body)

    async def start(self) -> None:
        server = self.context.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        server.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        if self.key is not None and self._gate is not None:
            self._gate.start()
            self.key.serve(server)
        bind_or_refuse(server, self.host, self.port, self.port - 1, "answer KV snapshots")
        self._socket = server
        self._task = asyncio.get_running_loop().create_task(self._serve(server))

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        self._task = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._gate is not None:
            self._gate.stop()
        self.context.term()

    async def _serve(self, server: zmq.asyncio.Socket) -> None:
        while True:
            frames = await server.recv_multipart()
            if b"" not in frames:  # no envelope: not a REQ asking; nothing to answer
                continue
            try:
                await server.send_multipart(await self._answer(frames))
            except Exception:  # a bug must not end the service
                log.exception("KV snapshot: answering a peer failed")

    async def _answer(self, frames: list[bytes]) -> list[bytes]:
        """The envelope (identity, empty delimiter) and the answer to the request after it."""
        split = frames.index(b"") + 1
        envelope, request = frames[:split], frames[split:]
        bound = asked_bound(request)
        if bound is None:
            return [*envelope, UNKNOWN]
        body = await self.packed()
        if body is None:
            return [*envelope, NONE]
        if len(body) > bound:
            return [*envelope, TOO_LARGE, str(len(body)).encode()]
        return [*envelope, SNAPSHOT, body]

    async def packed(self) -> bytes | None:
        """This router's packed snapshot (None: none to give), built and packed at most once
        per `CACHE_SECONDS`: requests are answered one at a time, so askers queued behind
        a build take its body."""
        if self._packed is not None and self._clock() - self._packed[0] < CACHE_SECONDS:
            return self._packed[1]
        snapshot = self.give()  # on the loop: the index does not change meanwhile
        body = None if snapshot is None else await asyncio.to_thread(msgpack.packb, snapshot)
        self._packed = (self._clock(), body)
        return body

    async def ask(self, endpoint: str) -> bytes | None:
        """One peer's packed snapshot, None when it has none; SnapshotError, TimeoutError."""
        asker = self.context.socket(zmq.REQ)
        try:
            asker.setsockopt(zmq.LINGER, 0)
            asker.setsockopt(zmq.MAXMSGSIZE, self.max_bytes + MAX_REQUEST_BYTES)
            if endpoint.startswith("tcp://["):
                asker.setsockopt(zmq.IPV6, 1)
            if self.key is not None:
                self.key.dial(asker)
            monitor = asker.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)
            try:
                asker.connect(endpoint)
                connected = await _connected(monitor, min(CONNECT_SECONDS, self.timeout_seconds))
            finally:
                stop_monitor(asker, monitor)
            if connected is False:
                raise PeerNotUp(f"{NOT_UP_REFUSED} (a replica starting too has nothing to give)")
            if connected is None:
                raise PeerNotUp(
                    f"its snapshot port took no connection within {CONNECT_SECONDS:g} s "
                    "(a replica starting too has nothing to give)"
                )
            async with asyncio.timeout(self.timeout_seconds):
                await asker.send_multipart(request_frames(self.max_bytes))
                return answer_body(await asker.recv_multipart())
        finally:
            asker.close(linger=0)

    async def take_from(
        self, endpoints: Sequence[str], take: Callable[[bytes, str], Awaitable[None]]
    ) -> str | None:
        """Ask all ``endpoints`` at once and give their snapshots, as they come, to
        ``take(body, endpoint)`` (it raises ValueError for one it cannot read) until it accepts
        one; within ``timeout_seconds`` in all. The endpoint taken from, or None."""
        asks = {asyncio.ensure_future(self.ask(endpoint)): endpoint for endpoint in endpoints}
        pending = set(asks)
        try:
            async with asyncio.timeout(self.timeout_seconds):
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for answered in done:
                        if await self._took(answered, asks[answered], take):
                            return asks[answered]
        except TimeoutError:
            for endpoint in sorted(asks[asking] for asking in pending):
                log.warning("no KV snapshot from %s: no answer within %gs", endpoint,
                            self.timeout_seconds)  # fmt: skip
        finally:
            for asking in pending:
                asking.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return None

    async def _took(
        self,
        answered: asyncio.Future[bytes | None],
        endpoint: str,
        take: Callable[[bytes, str], Awaitable[None]],
    ) -> bool:
        """Whether one peer's answer gave a snapshot ``take`` accepted (else logged why not:
        nothing a peer sends stops the start)."""
        try:
            body = answered.result()
        except TimeoutError:
            log.warning("no KV snapshot from %s: no answer within %gs", endpoint,
                        self.timeout_seconds)  # fmt: skip
            return False
        except PeerNotUp as err:
            log.info("no KV snapshot from %s: %s", endpoint, err)
            return False
        except (SnapshotError, zmq.ZMQError) as err:
            log.warning("no KV snapshot from %s: %s", endpoint, err)
            return False
        except Exception:
            log.exception("no KV snapshot from %s: asking it failed", endpoint)
            return False
        if body is None:
            log.info("no KV snapshot from %s: it has none yet", endpoint)
            return False
        try:
            await take(body, endpoint)
        except ValueError as err:
            log.warning("no KV snapshot from %s: %s", endpoint, err)
            return False
        except Exception:
            log.exception("no KV snapshot from %s: taking it failed", endpoint)
            return False
        return True
