"""A lean HTTP/1.1 load generator for the router benchmarks (asyncio protocols + httptools).

Pre-built request bytes, keep-alive connections, one request at a time per connection, so
the generator itself costs little CPU on a 2-core machine. Two modes:

- closed loop: ``concurrency`` connections send back to back for ``requests`` requests;
- open loop: requests start on a fixed schedule at ``rate`` per second (a late start is
  measured from its scheduled time, so queueing in the generator is not hidden).

Each result records the latency to the end of the response and, for streamed responses,
to the first body chunk. A connection the server closed (after a ``connection: close``
answer, or while it sat idle) is replaced, to the same target, before the next request is
written, never written to again, and a response not complete within
``request_timeout`` seconds (60) counts as an error, so one lost answer cannot hang a run.
Only loopback addresses are ever dialled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import httptools

REQUEST_TIMEOUT_SECONDS = 60.0


@dataclass
class Result:
    status: int
    first_chunk_seconds: float
    total_seconds: float


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall_seconds: float = 0.0
    errors: int = 0

    def latencies(self, first_chunk: bool = False) -> list[float]:
        values = [r.first_chunk_seconds if first_chunk else r.total_seconds for r in self.results]
        return sorted(values)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class _Client(asyncio.Protocol):
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.first: float | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP connection's transport (uvloop's does not subclass asyncio.Transport).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.close()  # the server closes it: replaced before the next request
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def request(
        self, data: bytes, started: float, request_timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> Result:
        assert self.transport is not None
        if self.lost or self.transport.is_closing():
            raise ConnectionError("connection closed by the server")
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.first = None
        self.transport.write(data)
        try:
            await asyncio.wait_for(self.waiter, request_timeout)
        except TimeoutError:
            self.close()
            raise ConnectionError(f"no complete response within {request_timeout} s") from None
        end = time.perf_counter()
        first = self.first if self.first is not None else end
        return Result(self.status, first - started, end - started)

    @property
    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


async def _connect(target: tuple[str, int]) -> _Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: _Client(target), *target)
    return client


async def _usable(client: _Client) -> _Client:
    """``client``, or a new connection to its target if the server closed it; the closed one
    back if the server refuses (the request then fails at once, as an error, rather than
    waiting)."""
    if client.usable:
        return client
    client.close()
    try:
        return await asyncio.wait_for(_connect(client.target), REQUEST_TIMEOUT_SECONDS)
    except (OSError, TimeoutError):
        return client


def build_request(path: str, body: bytes, host: str = "127.0.0.1") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def closed_loop(
    targets: Sequence[tuple[str, int]],
    make: Callable[[int], bytes],
    requests: int,
    concurrency: int,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> Run:
    """``concurrency`` connections (spread over ``targets``) send ``requests`` in total."""
    run = Run()
    counter = iter(range(requests))
    clients = [await _connect(targets[i % len(targets)]) for i in range(concurrency)]

    async def worker(client: _Client) -> None:
        for i in counter:
            if not client.usable:
                client = await _usable(client)
                clients.append(client)
            try:
                run.results.append(
                    await client.request(make(i), time.perf_counter(), request_timeout)
                )
            except ConnectionError:
                run.errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    run.wall_seconds = time.perf_counter() - start
    for client in clients:
        client.close()
    return run


async def open_loop(
    targets: Sequence[tuple[str, int]],
    make: Callable[[int], bytes],
    requests: int,
    rate: float,
    connections: int = 64,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> Run:
    """Start request ``i`` at ``i / rate`` seconds, on the next free connection."""
    run = Run()
    idle: asyncio.Queue[_Client] = asyncio.Queue()
    for i in range(connections):
        idle.put_nowait(await _connect(targets[i % len(targets)]))
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    tasks = []

    async def one(i: int, scheduled: float) -> None:
        client = await _usable(await idle.get())
        try:
            run.results.append(await client.request(make(i), scheduled, request_timeout))
        except ConnectionError:
            run.errors += 1
        idle.put_nowait(client)

    for i in range(requests):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(one(i, scheduled)))
    await asyncio.gather(*tasks)
    run.wall_seconds = time.perf_counter() - start
    while not idle.empty():
        idle.get_nowait().close()
    return run
