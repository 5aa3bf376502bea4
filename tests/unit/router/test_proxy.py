"""Upstream connections on a loopback socket: the deadlines of requests sharing a kept-alive
connection, which share its one timer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tpuserve_router.config import RouterConfig
from tpuserve_router.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.server import HttpRequest, serve

pytestmark = pytest.mark.unit

LONG = 30.0  # seconds: never reached in these tests


async def worker(request: HttpRequest) -> None:
    if request.path == "/slow":
        await asyncio.sleep(0.3)
    elif request.path == "/late":
        await asyncio.sleep(2)  # past the deadlines the tests give it
    request.respond(200, b"", b"ok")


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    server = await serve(worker, "127.0.0.1", 0, RouterConfig().front_limits())
    yield UpstreamPool(
        "127.0.0.1", server.sockets[0].getsockname()[1], connect_timeout_seconds=5,
        max_idle=4, max_head_bytes=1 << 16, max_body_bytes=1 << 20,
    )  # fmt: skip
    server.close()
    await server.wait_closed()


async def ask(
    pool: UpstreamPool, path: str, first_byte: float, total: float = LONG
) -> UpstreamConnection:
    """One request on a pooled connection, answered (or failed) within 5 s; the connection
    goes back to the pool."""
    conn = pool.take_idle() or await pool.connect()
    try:
        conn.send(b"GET " + path.encode() + b" HTTP/1.1\r\nhost: h\r\n\r\n")
        conn.set_deadlines(first_byte, total, LONG)
        async with asyncio.timeout(5):
            await conn.wait_head()
            assert await conn.read_all() == b"ok"
        return conn
    finally:
        pool.release(conn)


async def test_a_later_request_gets_its_own_shorter_first_byte_deadline(
    pool: UpstreamPool,
) -> None:
    first = await ask(pool, "/x", first_byte=LONG)
    with pytest.raises(UpstreamError) as failed:
        await ask(pool, "/late", first_byte=0.05)
    assert pool.idle == []
    assert first.closed
    assert failed.value.reason == "first_byte_timeout"


async def test_a_later_request_gets_its_own_shorter_total_deadline(pool: UpstreamPool) -> None:
    await ask(pool, "/x", first_byte=LONG)
    with pytest.raises(UpstreamError) as failed:
        await ask(pool, "/late", first_byte=LONG, total=0.05)
    assert failed.value.reason == "request_timeout"


async def test_an_earlier_requests_short_deadline_does_not_cut_the_next_one(
    pool: UpstreamPool,
) -> None:
    first = await ask(pool, "/x", first_byte=0.05)  # its timer fires during the next request
    second = await ask(pool, "/slow", first_byte=LONG)
    assert second is first
    assert not second.closed


async def test_requests_on_a_kept_alive_connection_share_its_timer(pool: UpstreamPool) -> None:
    first = await ask(pool, "/x", first_byte=LONG)
    timer = first._deadline
    assert timer is not None
    assert not timer.cancelled()
    for _ in range(3):
        assert await ask(pool, "/x", first_byte=LONG) is first
    assert first._deadline is timer  # left armed, none made per request


async def test_closing_a_connection_cancels_its_timer(pool: UpstreamPool) -> None:
    conn = await ask(pool, "/x", first_byte=LONG)
    timer = conn._deadline
    assert timer is not None
    conn.close()
    assert timer.cancelled()
    assert conn._deadline is None
