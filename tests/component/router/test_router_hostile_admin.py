"""A proxy in the router's pod opens nothing: through a local TCP proxy that dials the router
from 127.0.0.6 (as Istio's sidecar does), no admin route answers without an admin key, and
neither peering port gives a routing decision or a KV snapshot without the replicas' key.

A real router listening as in a pod (``--host 0.0.0.0``, the default ``--admin loopback``,
``--admin-port``, peering with ``--peer-key-file``), a tiny asyncio proxy on 127.0.0.1, and
real ZMQ sockets, all on loopback. Before issue 47 the admin API trusted any loopback peer
address and the peering ports asked for no key at all: through such a proxy a remote client
listed, added and removed workers, read ``/kv_snapshot`` and every routing decision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from tests.waiting import eventually_async
from tpuserve.cluster.ports import free_port_pair
from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import RouterConfig
from tpuserve_router.peering.peer_auth import PeerKey
from tpuserve_router.peering.peer_snapshot import request_frames

pytestmark = pytest.mark.component

SIDECAR_ADDRESS = "127.0.0.6"  # where Istio's sidecar dials the application from
ADMIN_KEY = "sk-admin-0123456789abcdef"
PEER_SECRET = b"the-replicas-shared-secret-0123456789"
ADMIN_ROUTES = [
    ("GET", "/workers", None),
    ("POST", "/workers", {"url": "http://127.0.0.1:9"}),
    ("POST", "/add_worker", {"url": "http://127.0.0.1:9"}),
    ("DELETE", "/workers", {"url": "http://127.0.0.1:9"}),
    ("POST", "/remove_worker", {"url": "http://127.0.0.1:9"}),
    ("POST", "/flush_cache", None),
    ("GET", "/kv_snapshot", None),
]
NO_ANSWER_SECONDS = 2.0


class Proxy:
    """Forwards every connection to ``target`` on loopback, dialling from ``source``."""

    def __init__(self, target: int, source: str = SIDECAR_ADDRESS) -> None:
        self.target = target
        self.source = source
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", self.target, local_addr=(self.source, 0)
        )
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        self.tasks.update(pipes)
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def pod(tmp_path: Path) -> AsyncIterator[RouterApp]:
    """A router configured as in a pod: every address, peering with a key, an admin port."""
    keys = tmp_path / "keys.json"
    keys.write_bytes(orjson.dumps({"keys": [{"key": ADMIN_KEY, "tenant": "ops", "admin": True}]}))
    secret = tmp_path / "peer-key"
    secret.write_bytes(PEER_SECRET + b"\n")
    config = RouterConfig(
        host="0.0.0.0", port=0, admin_port=0, api_keys_file=str(keys), peer_port=free_port_pair(),
        peer_key_file=str(secret), policy="precise", kv_events=True,
    )  # fmt: skip
    app = create_router_app(config, registry=CollectorRegistry())
    await app.start()
    yield app
    await app.stop()


@contextlib.asynccontextmanager
async def proxied(port: int) -> AsyncIterator[int]:
    proxy = Proxy(port)
    try:
        yield await proxy.start()
    finally:
        await proxy.stop()


async def call(
    session: aiohttp.ClientSession, port: int, method: str, path: str, body: Any, key: str = ""
) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"http://127.0.0.1:{port}{path}"
    async with session.request(method, url, json=body, headers=headers) as answer:
        return answer.status


async def test_through_a_proxy_in_the_pod_no_admin_route_answers_without_an_admin_key(
    pod: RouterApp,
) -> None:
    async with proxied(pod.port) as port, aiohttp.ClientSession() as session:
        refused = [await call(session, port, m, p, b) for m, p, b in ADMIN_ROUTES]
        keyed = [await call(session, port, m, p, b, ADMIN_KEY) for m, p, b in ADMIN_ROUTES]
    assert refused == [403] * len(ADMIN_ROUTES)
    assert 403 not in keyed
    assert pod.registry.names() == []  # the keyed add was removed again; nothing else stayed


async def test_the_admin_port_answers_this_pod_alone_and_only_the_admin_api(
    pod: RouterApp,
) -> None:
    assert pod.admin_port is not None
    async with aiohttp.ClientSession() as session:
        assert await call(session, pod.admin_port, "GET", "/workers", None) == 200
        assert await call(session, pod.admin_port, "GET", "/v1/models", None) == 404
    with pytest.raises(ConnectionRefusedError):  # bound to 127.0.0.1: not on another address
        await asyncio.open_connection(SIDECAR_ADDRESS, pod.admin_port)


async def received(socket: zmq.asyncio.Socket, seconds: float) -> list[bytes] | None:
    try:
        return await asyncio.wait_for(socket.recv_multipart(), seconds)
    except TimeoutError:
        return None


async def test_through_a_proxy_no_peering_stream_answers_without_the_replicas_key(
    pod: RouterApp,
) -> None:
    peer_port = pod.config.peer_port
    key = PeerKey.from_secret(PEER_SECRET)
    context = zmq.asyncio.Context()
    sockets: list[zmq.asyncio.Socket] = []

    def dial(kind: int, port: int, with_key: PeerKey | None) -> zmq.asyncio.Socket:
        socket = context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        if kind == zmq.SUB:
            socket.setsockopt(zmq.SUBSCRIBE, b"")
        if with_key is not None:
            with_key.dial(socket)
        socket.connect(f"tcp://127.0.0.1:{port}")
        sockets.append(socket)
        return socket

    try:
        async with proxied(peer_port) as decisions, proxied(peer_port + 1) as snapshots:
            anonymous = dial(zmq.SUB, decisions, None)
            stranger = dial(zmq.SUB, decisions, PeerKey.from_secret(b"a-guess-at-the-secret"))
            replica = dial(zmq.SUB, decisions, key)
            # the router says hello every second: a replica hears it, the others nothing
            assert await received(replica, 5.0) is not None
            assert await received(anonymous, NO_ANSWER_SECONDS) is None
            assert await received(stranger, NO_ANSWER_SECONDS) is None
            asker = dial(zmq.REQ, snapshots, None)
            await asker.send_multipart(request_frames(1 << 20))
            assert await received(asker, NO_ANSWER_SECONDS) is None
            keyed_asker = dial(zmq.REQ, snapshots, key)
            await keyed_asker.send_multipart(request_frames(1 << 20))
            assert await received(keyed_asker, 5.0) is not None
    finally:
        for socket in sockets:
            socket.close(linger=0)
        context.term()


async def test_replicas_holding_the_key_hear_each_other(tmp_path: Path) -> None:
    secret = tmp_path / "peer-key"
    secret.write_bytes(PEER_SECRET)
    ports = [free_port_pair(), free_port_pair()]

    def replica(mine: int, theirs: int) -> RouterApp:
        config = RouterConfig(
            host="0.0.0.0", port=0, peer_port=mine, peers=(f"tcp://127.0.0.1:{theirs}",),
            peer_key_file=str(secret), policy="precise", kv_events=True,
        )  # fmt: skip
        return create_router_app(config, registry=CollectorRegistry())

    apps = [replica(*ports), replica(*ports[::-1])]
    for app in apps:
        await app.start()
    try:
        await eventually_async(
            lambda: all(
                app.metrics.registry.get_sample_value("tpuserve_router_peers") == 1 for app in apps
            ),
            what="each replica connected to the other",
        )
    finally:
        for app in apps:
            await app.stop()
