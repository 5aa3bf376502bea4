"""bench/router_loadgen.py survives what a router may do to its connections: a
``connection: close`` answer is not followed by a write to that connection, a connection
closed while idle is replaced (to the same target) before the next request, and an answer
that never comes is an error after the timeout, not a hung run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bench.router_loadgen import Run, build_request, closed_loop, open_loop

pytestmark = pytest.mark.component

BODY = b'{"ok":true}'


def answer(status: int, close: bool) -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(BODY)}\r\n"
    if close:
        head += "connection: close\r\n"
    return (head + "\r\n").encode() + BODY


class Server:
    """A loopback HTTP server answering each request by ``reply(n)`` (n counts requests):
    bytes to send, then close if they say ``connection: close``; None: never answer. With
    ``close_when_idle`` it closes every connection right after answering, without saying so
    (as a server's idle timeout does)."""

    def __init__(
        self, reply: Callable[[int], bytes | None], *, close_when_idle: bool = False
    ) -> None:
        self.reply = reply
        self.close_when_idle = close_when_idle
        self.requests = 0
        self.connections = 0
        self.writes_after_close = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                data = self.reply(self.requests)
                if data is None:
                    continue
                writer.write(data)
                await writer.drain()
                if self.close_when_idle:
                    break
                if b"connection: close" in data:
                    writer.write_eof()
                    if await reader.read(1):
                        self.writes_after_close += 1
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


Start = Callable[[Server], Awaitable[tuple[str, int]]]


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    servers: list[asyncio.Server] = []

    async def start(server: Server) -> tuple[str, int]:
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(listening)
        host, port = listening.sockets[0].getsockname()[:2]
        return str(host), int(port)

    yield start
    for listening in servers:
        listening.close()


def statuses(run: Run) -> list[int]:
    return sorted(r.status for r in run.results)


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_a_connection_closed_by_the_server_is_replaced(serve: Start, mode: str) -> None:
    server = Server(lambda n: answer(500, close=True) if n % 5 == 0 else answer(200, close=False))
    target = await serve(server)
    request = build_request("/v1/completions", b"{}")
    if mode == "open":
        run = await open_loop([target], lambda i: request, 40, rate=2000.0, connections=4)
    else:
        run = await closed_loop([target], lambda i: request, 40, concurrency=4)
    assert run.errors == 0
    assert statuses(run) == [200] * 32 + [500] * 8
    assert server.writes_after_close == 0


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_an_answer_that_never_comes_is_an_error_after_the_timeout(
    serve: Start, mode: str
) -> None:
    server = Server(lambda n: None if n == 3 else answer(200, close=False))
    target = await serve(server)
    request = build_request("/v1/completions", b"{}")
    if mode == "open":
        run = await open_loop([target], lambda i: request, 10, 1000.0, 2, request_timeout=2.0)
    else:
        run = await closed_loop([target], lambda i: request, 10, 2, request_timeout=2.0)
    assert run.errors == 1
    assert statuses(run) == [200] * 9


async def test_a_connection_closed_while_idle_is_replaced_before_the_next_request(
    serve: Start,
) -> None:
    server = Server(lambda n: answer(200, close=False), close_when_idle=True)
    target = await serve(server)
    request = build_request("/v1/completions", b"{}")
    # 20 ms between requests on one connection: each is closed long before the next is due
    run = await open_loop([target], lambda i: request, 10, rate=50.0, connections=1)
    assert run.errors == 0
    assert statuses(run) == [200] * 10
    assert server.connections == 10


async def test_a_closed_connection_is_replaced_to_its_own_target(serve: Start) -> None:
    closing = Server(lambda n: answer(200, close=True))
    keeping = Server(lambda n: answer(200, close=False))
    targets = [await serve(closing), await serve(keeping)]
    request = build_request("/v1/completions", b"{}")
    run = await closed_loop(targets, lambda i: request, 40, concurrency=2)
    assert run.errors == 0
    assert closing.requests + keeping.requests == 40
    assert keeping.connections == 1  # never handed a replacement for the other's connection
    assert closing.connections == closing.requests  # one per request, none left over unused
