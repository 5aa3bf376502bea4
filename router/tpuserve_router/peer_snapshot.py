"""KV snapshots between router replicas over peering: a replica started late asks its peers.

With ``--peer-port P`` the router also binds a ZMQ ROUTER socket on port ``P + 1``
(`snapshot_port`) and answers there with its block index (`kv_events.KvEventHub.snapshot`,
packed with msgpack off the event loop). A starting router with peers asks them in turn,
before it subscribes to any engine, and seeds its index from the first snapshot it can read
(`SnapshotService.take_from`); each peer gets ``--kv-snapshot-timeout`` seconds to answer.
No key is asked for: the port is fenced to the server's own routers (the operator's
NetworkPolicy) and a snapshot holds block hashes, no prompt text.

Wire (a REQ socket asks, the ROUTER answers): the request is `REQUEST` and the most bytes
the asker takes (decimal ASCII); the answer is `SNAPSHOT` and the msgpack snapshot (opaque
here: `KvEventHub.seed` reads it), `NONE` when this router has nothing to give (it follows
no KV events, or has not heard any batch yet: a replica just started), `TOO_LARGE` and the
snapshot's size in bytes, or `UNKNOWN` for a request it cannot read. The asker also sets
``MAXMSGSIZE``, so a peer ignoring the bound is cut off rather than read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgpack
import zmq
import zmq.asyncio

from tpuserve_router.peers import bind_or_refuse, peer_endpoint

log = logging.getLogger(__name__)

REQUEST: Final = b"kv-snapshot/1"
SNAPSHOT: Final = b"snapshot"
NONE: Final = b"none"
TOO_LARGE: Final = b"too-large"
UNKNOWN: Final = b"unknown"
MAX_REQUEST_BYTES: Final = 256


class SnapshotError(Exception):
    """A peer's answer that gives no snapshot, said as one sentence."""


def snapshot_port(peer_port: int) -> int:
    """The port snapshots are asked on: the peer port's next one."""
    return peer_port + 1


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
    ) -> None:
        self.give = give
        self.host = host
        self.port = port
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes
        self.context = zmq.asyncio.Context()
        self._socket: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        server = self.context.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        server.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        bind_or_refuse(server, self.host, self.port, self.port - 1, "answer KV snapshots")
        self._socket = server
        self._task = asyncio.get_running_loop().create_task(self._serve(server))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
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
        snapshot = self.give()  # on the loop: the index does not change meanwhile
        if snapshot is None:
            return [*envelope, NONE]
        body: bytes = await asyncio.to_thread(msgpack.packb, snapshot)  # the big part, off it
        if len(body) > bound:
            return [*envelope, TOO_LARGE, str(len(body)).encode()]
        return [*envelope, SNAPSHOT, body]

    async def ask(self, endpoint: str) -> bytes | None:
        """One peer's packed snapshot, None when it has none; SnapshotError, TimeoutError."""
        asker = self.context.socket(zmq.REQ)
        try:
            asker.setsockopt(zmq.LINGER, 0)
            asker.setsockopt(zmq.MAXMSGSIZE, self.max_bytes + MAX_REQUEST_BYTES)
            if endpoint.startswith("tcp://["):
                asker.setsockopt(zmq.IPV6, 1)
            asker.connect(endpoint)
            async with asyncio.timeout(self.timeout_seconds):
                await asker.send_multipart(request_frames(self.max_bytes))
                return answer_body(await asker.recv_multipart())
        finally:
            asker.close(linger=0)

    async def take_from(
        self, endpoints: Sequence[str], take: Callable[[bytes, str], Awaitable[None]]
    ) -> str | None:
        """Ask ``endpoints`` in turn until ``take(body, endpoint)`` accepts one's snapshot
        (it raises ValueError for one it cannot read); the endpoint it came from, or None."""
        for endpoint in endpoints:
            try:
                body = await self.ask(endpoint)
            except TimeoutError:
                log.warning("no KV snapshot from %s: no answer within %gs", endpoint,
                            self.timeout_seconds)  # fmt: skip
                continue
            except (SnapshotError, zmq.ZMQError) as err:
                log.warning("no KV snapshot from %s: %s", endpoint, err)
                continue
            if body is None:
                log.info("no KV snapshot from %s: it has none yet", endpoint)
                continue
            try:
                await take(body, endpoint)
            except ValueError as err:
                log.warning("no KV snapshot from %s: %s", endpoint, err)
                continue
            return endpoint
        return None
