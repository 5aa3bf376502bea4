"""The HTTP front on a loopback socket: limits, framing and keep-alive."""

from __future__ import annotations

import asyncio
import gc
import re
import weakref
from collections.abc import AsyncIterator

import pytest

from tests.waiting import eventually_async
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.proxy import UpstreamPool
from tpuserve_router.front.connections import BufferBudget, ConnectionBook
from tpuserve_router.front.http_request import Handler, HeadCheck, HttpRequest
from tpuserve_router.front.server import front_limits, serve
from tpuserve_router.pipeline.request_body import ClientError

pytestmark = pytest.mark.unit

LIMIT = 1024


async def echo(request: HttpRequest) -> None:
    if request.path == "/stream":
        request.start_chunked(200, b"content-type: text/event-stream\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            request.write_chunk(part)
        request.end_chunked()
        return
    if request.path == "/forget":
        return  # a handler that never answers
    request.respond(200, b"", b"%d:%s" % (len(request.body), request.query.encode()))


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = await serve(echo, "127.0.0.1", 0, front_limits(RouterConfig(max_request_bytes=LIMIT)))
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def statuses(data: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1.1 (\d+)", data)


async def test_a_declared_oversized_body_is_413_without_reading_it(port: int) -> None:
    head = b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: 5000\r\n\r\n"
    data = await exchange(port, head)  # the body is never sent: the answer comes anyway
    assert statuses(data) == [b"413"]
    assert b'"param":"body"' in data


async def test_a_chunked_body_over_the_limit_is_413(port: int) -> None:
    chunk = b"x" * 600
    body = b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n"
    data = await exchange(
        port, b"POST /x HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n" + body
    )
    assert statuses(data) == [b"413"]


async def test_a_chunked_body_within_the_limit_is_joined(port: int) -> None:
    body = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    request = (
        b"POST /x?a=1 HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n"
        b"connection: close\r\n\r\n"
    )
    data = await exchange(port, request + body)
    assert data.endswith(b"5:a=1")


async def test_expect_100_continue_is_answered(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim.startswith(b"HTTP/1.1 100")
    writer.write(b"abc")
    final = await asyncio.wait_for(reader.readuntil(b"3:"), 5)
    assert final.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_garbage_is_400_and_closes(port: int) -> None:
    data = await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert statuses(data) == [b"400"]


async def test_http_1_0_closes_after_the_response(port: int) -> None:
    data = await exchange(port, b"POST /x HTTP/1.0\r\ncontent-length: 2\r\n\r\nab")
    assert statuses(data) == [b"200"]
    assert b"connection: close" in data


async def test_streams_are_chunked_and_the_connection_stays_open(port: int) -> None:
    get = b"GET /stream HTTP/1.1\r\nhost: h\r\n\r\n"
    data = await exchange(port, get + get.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
    assert statuses(data) == [b"200", b"200"]
    assert data.count(b"transfer-encoding: chunked") == 2
    assert b"9\r\ndata: 1\n\n\r\n" in data


async def test_a_handler_that_never_answers_gets_the_connection_closed(port: int) -> None:
    data = await exchange(port, b"GET /forget HTTP/1.1\r\nhost: h\r\n\r\n")
    assert data == b""


async def test_a_closed_connection_is_freed_at_once_with_its_buffers() -> None:
    """No reference cycle keeps a connection (and the body it read) for the collector: the
    router collects rarely, and a cycle per connection made its memory creep."""
    book = ConnectionBook(16, 1.0)
    server = await serve(echo, "127.0.0.1", 0, front_limits(RouterConfig()), book)
    port = server.sockets[0].getsockname()[1]
    gc.disable()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nconnection: close\r\ncontent-length: 100000\r\n\r\n")
        writer.write(b"a" * 100_000)
        await eventually_async(lambda: len(book.open) == 1, what="the connection accepted")
        conn = weakref.ref(next(iter(book.open)))
        assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"100000:")
        writer.close()
        await eventually_async(lambda: conn() is None, what="the closed connection freed")
    finally:
        gc.enable()
        server.close()
        await server.wait_closed()


async def test_a_closed_upstream_connection_is_freed_at_once(port: int) -> None:
    pool = UpstreamPool(
        "127.0.0.1", port, connect_timeout_seconds=5, max_idle=0,
        max_head_bytes=1 << 16, max_body_bytes=1 << 20,
    )  # fmt: skip
    gc.disable()
    try:
        upstream = await pool.connect()
        upstream.send(b"GET /x HTTP/1.1\r\nhost: h\r\n\r\n")
        await upstream.wait_head()
        assert await upstream.read_all() == b"0:"
        conn = weakref.ref(upstream)
        pool.release(upstream)  # max_idle=0: closed
        del upstream
        await eventually_async(lambda: conn() is None, what="the upstream connection freed")
    finally:
        gc.enable()


class Gate:
    """A handler that holds every request until released, then echoes its body's size."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.seen = 0

    async def __call__(self, request: HttpRequest) -> None:
        self.seen += 1
        await self.release.wait()
        request.respond(200, b"", b"%d:" % len(request.body))


async def budgeted(
    handler: Handler, max_bytes: int, head_check: HeadCheck | None = None
) -> tuple[asyncio.Server, ConnectionBook, int]:
    book = ConnectionBook(16, 1.0, buffers=BufferBudget(max_bytes))
    server = await serve(handler, "127.0.0.1", 0, front_limits(RouterConfig()), book, head_check)
    return server, book, server.sockets[0].getsockname()[1]


def post(size: int, *, close: bool = False) -> bytes:
    connection = b"connection: close\r\n" if close else b""
    return b"POST /x HTTP/1.1\r\nhost: h\r\n%scontent-length: %d\r\n\r\n%s" % (
        connection, size, b"a" * size
    )  # fmt: skip


async def test_bodies_are_charged_to_the_budget_until_answered_pipelined_ones_too() -> None:
    gate = Gate()
    server, book, port = await budgeted(gate, 10_000)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(3000) + post(2000) + post(1000, close=True))  # read ahead, held
        await eventually_async(lambda: book.buffers.used == 6000, what="three bodies charged")
        gate.release.set()
        data = await asyncio.wait_for(reader.read(), 5)
        assert statuses(data) == [b"200"] * 3
        await eventually_async(lambda: book.buffers.used == 0, what="every charge given back")
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_body_that_does_not_fit_the_budget_is_503_with_retry_after() -> None:
    gate = Gate()
    server, book, port = await budgeted(gate, 5000)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post(4000))
        await eventually_async(lambda: gate.seen == 1, what="the first body read")
        head = b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: 2000\r\n\r\n"
        data = await exchange(port, head)  # declared: refused before a byte of it is read
        assert statuses(data) == [b"503"]
        assert b"retry-after: 1\r\n" in data
        assert b"--max-buffered-bytes" in data
        chunked = b"POST /x HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n"
        chunk = b"%x\r\n%s\r\n" % (600, b"x" * 600)
        data = await exchange(port, chunked + chunk * 2)  # refused once it runs past
        assert statuses(data) == [b"503"]
        assert book.buffers.used == 4000  # the refused ones gave back what they took
        gate.release.set()
        assert statuses(await asyncio.wait_for(reader.readuntil(b"4000:"), 5)) == [b"200"]
        await eventually_async(lambda: book.buffers.used == 0, what="the charge given back")
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_the_head_check_refuses_before_the_body_is_read() -> None:
    checked: list[tuple[bytes, bytes, bool]] = []

    def head_check(
        method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], local: bool
    ) -> ClientError | None:
        checked.append((method, url, local))
        if (b"authorization", b"Bearer good") in headers:
            return None
        return ClientError(401, "no key", headers={"www-authenticate": "Bearer"})

    server, book, port = await budgeted(echo, 1 << 20, head_check)
    try:
        head = b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: 100000\r\n"
        data = await exchange(port, head + b"expect: 100-continue\r\n\r\n")  # no body sent
        assert statuses(data) == [b"401"]  # and no 100 Continue before it
        assert b"www-authenticate: Bearer\r\n" in data
        assert book.buffers.used == 0
        data = await exchange(
            port, head + b"authorization: Bearer good\r\nconnection: close\r\n\r\n" + b"a" * 100000
        )
        assert data.endswith(b"100000:")
        assert checked == [(b"POST", b"/x", True)] * 2  # a listener bound to loopback
    finally:
        server.close()
        await server.wait_closed()
