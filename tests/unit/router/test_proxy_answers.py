"""A worker's whole answer read in one native call (`_native.whole_answer`, the upstream
connection's fast path) reads what httptools reads, and declines the rest: each answer below
is read both ways, and through a real upstream connection on loopback."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httptools
import pytest

from tpuserve_router._native import whole_answer
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool

pytestmark = pytest.mark.unit

MAX_BODY = 1 << 20


@dataclass
class Read:
    """What httptools' callbacks say of one feed."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    complete: int = 0
    keep_alive: bool = False
    parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete += 1
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()  # as the proxy asks: in the callback


def by_httptools(data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    read = Read()
    parser = read.parser = httptools.HttpResponseParser(read)
    parser.feed_data(data)
    assert read.complete == 1
    return parser.get_status_code(), read.headers, b"".join(read.body), read.keep_alive


READ_NATIVELY = [
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Odd:\tvalue with  spaces\r\n\r\nhello",
    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 503\r\nretry-after: 1\r\ncontent-length: 3\r\n\r\nbad",
    b"HTTP/1.1 200 OK\r\nx-a: \xc3\xa9t\xc3\xa9\r\ncontent-length: 1\r\n\r\n\x00",
    b"HTTP/1.1 200 OK\r\nx-a:1\r\nx-a: 2\r\ncontent-length: 4\r\n\r\n\r\n\r\n",
]

LEFT_TO_HTTPTOOLS = [
    b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nhi",  # more to come
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\n",  # a second answer
    b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nx-a: 1 \r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\nx-a:\r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\ncontent-length: 2\n\nhi",
    b"HTTP/1.1 200 OK\r\n folded: 1\r\ncontent-length: 2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nhi",
    b"HTTP/1.1 200 OK\r\n\r\nhi",  # read to the connection's close
    b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\nhi",
    b"garbage",
]


@pytest.mark.parametrize("data", READ_NATIVELY)
def test_an_answer_read_natively_reads_as_httptools_reads_it(data: bytes) -> None:
    read = whole_answer(data, MAX_BODY)
    assert read is not None, data
    status, headers, body_at = read
    assert (status, headers, data[body_at:], True) == by_httptools(data)


@pytest.mark.parametrize("data", LEFT_TO_HTTPTOOLS)
def test_any_other_answer_is_left_to_httptools(data: bytes) -> None:
    assert whole_answer(data, MAX_BODY) is None


def test_a_body_over_the_limit_is_left_to_httptools() -> None:
    data = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
    assert whole_answer(data, 5) is not None
    assert whole_answer(data, 4) is None


async def test_a_connection_reads_answers_both_ways_and_is_kept_alive() -> None:
    """A worker on loopback answers a kept-alive connection's requests in one write each
    (native), in pieces (httptools), then with bytes past the answer (a broken upstream)."""
    answers = [READ_NATIVELY[0], READ_NATIVELY[1], READ_NATIVELY[0] + b"HTTP/1.1 200 OK\r\n"]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i, answer in enumerate(answers):
            await reader.readuntil(b"\r\n\r\n")
            if i == 1:  # the head and the body apart
                writer.write(answer[:20])
                await writer.drain()
                await asyncio.sleep(0.05)
                answer = answer[20:]
            writer.write(answer)
            await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = UpstreamPool(
        "127.0.0.1", port, connect_timeout_seconds=5, max_idle=1, max_head_bytes=1 << 16,
        max_body_bytes=MAX_BODY,
    )  # fmt: skip
    conns: list[UpstreamConnection] = []
    try:
        for i in range(len(answers)):
            conn = pool.take_idle() or await pool.connect()
            conns.append(conn)
            conn.send(b"GET / HTTP/1.1\r\nhost: h\r\n\r\n")
            conn.set_deadlines(5, 5, 5)
            async with asyncio.timeout(5):
                await conn.wait_head()
                body = await conn.read_all()
            status, headers, expected, _ = by_httptools(READ_NATIVELY[(0, 1, 0)[i]])
            assert (conn.status, conn.headers, body) == (status, headers, expected)
            assert conn.done
            assert conn.keep_alive
            if i == 2:
                assert isinstance(conn.error, UpstreamError)  # bytes past the answer
            pool.release(conn)
        assert conns[0] is conns[1] is conns[2]  # one kept-alive connection throughout
    finally:
        for conn in conns:
            conn.close()
        server.close()
        await server.wait_closed()
