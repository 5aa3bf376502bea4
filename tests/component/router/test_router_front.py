"""The router's front under hostile clients, over raw sockets: oversized and slow requests are
answered and closed, idle sockets by the thousand lock out neither clients nor probes, and
a worker cannot make the router buffer an unbounded answer."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
import pytest

from tests.fakes import STUB_MODEL, StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp

pytestmark = pytest.mark.component

TIMEOUT = 0.3  # every front timeout in `quick`, seconds
LIMITS = {
    "max_request_line_bytes": 1024,
    "max_header_bytes": 4096,
    "max_headers": 20,
    "max_request_bytes": 65536,
    "max_prompt_chars": 1000,
    "max_response_bytes": 8192,
    "header_timeout_seconds": TIMEOUT,
    "body_timeout_seconds": TIMEOUT,
    "keep_alive_timeout_seconds": TIMEOUT,
    "send_timeout_seconds": TIMEOUT,
}


def router(*workers: StubWorker, **settings: Any) -> AbstractAsyncContextManager[RouterApp]:
    """A least_load router (with a metrics port) in front of started ``workers``."""
    return stub_router(*workers, **{"metrics_port": 0, **settings})


@pytest.fixture
async def quick() -> AsyncIterator[RouterApp]:
    """Small limits and 0.3 s timeouts, in front of one well-behaved worker."""
    async with router(StubWorker(), **LIMITS) as app:
        yield app


def closing() -> bytes:
    """A completion asking the router to close the connection after answering."""
    return completion(extra=b"connection: close\r\n")


def completion(prompt: str = "hello", extra: bytes = b"") -> bytes:
    body = orjson.dumps({"model": STUB_MODEL, "prompt": prompt, "max_tokens": 1})
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
        + extra
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


async def exchange(port: int, data: bytes, *, read_seconds: float = 10) -> bytes:
    """Send ``data``, then read until the router closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        with contextlib.suppress(ConnectionError):
            return await asyncio.wait_for(reader.read(), read_seconds)
        return b""
    finally:
        writer.close()


def statuses(data: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"HTTP/1.1 (\d{3}) ", data)]


def closed(app: RouterApp, reason: str) -> float:
    value = app.metrics.registry.get_sample_value(
        "tpuserve_router_connections_closed_total", {"reason": reason}
    )
    return value or 0.0


async def served(app: RouterApp, port: int | None = None, path: str = "") -> int:
    """The status of one ordinary request (a completion, or GET ``path``) on a new connection."""
    if path:
        request = b"GET %s HTTP/1.1\r\nhost: r\r\nconnection: close\r\n\r\n" % path.encode()
    else:
        request = completion(extra=b"connection: close\r\n")
    found = statuses(await exchange(port or app.port, request))
    assert len(found) == 1, found
    return found[0]


# ------------------------------------------------------------------ oversized requests


async def test_a_huge_header_is_431_after_reading_only_the_limit(quick: RouterApp) -> None:
    head = b"GET /health HTTP/1.1\r\nhost: r\r\nx-big: "
    data = await exchange(quick.port, head + b"a" * (8 << 20))
    assert statuses(data) == [431]
    assert b'"param":"headers"' in data
    assert closed(quick, "head_too_large") == 1
    assert await served(quick) == 200


async def test_too_many_headers_is_431(quick: RouterApp) -> None:
    headers = b"".join(b"x-h%d: v\r\n" % i for i in range(50))
    data = await exchange(quick.port, b"GET /health HTTP/1.1\r\n" + headers + b"\r\n")
    assert statuses(data) == [431]
    assert b"50 headers" in data


async def test_a_long_url_is_414(quick: RouterApp) -> None:
    data = await exchange(quick.port, b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nhost: r\r\n\r\n")
    assert statuses(data) == [414]


async def test_a_prompt_over_the_limit_is_413_before_it_is_tokenized() -> None:
    async with router(StubWorker(), **LIMITS, policy="precise", kv_events=False) as app:
        assert app.tokenizer is not None
        found = statuses(await exchange(app.port, completion("x" * 2000)))
        assert found == [413]
        assert (app.tokenizer.hits, app.tokenizer.misses) == (0, 0)
        assert await served(app) == 200


# ------------------------------------------------------------------ slow and idle clients


async def test_a_slowloris_head_gets_408_and_is_closed(quick: RouterApp) -> None:
    data = await exchange(quick.port, b"POST /v1/completions HTTP/1.1\r\nhost: r\r\n")
    assert statuses(data) == [408]
    assert closed(quick, "header_timeout") == 1


async def test_a_body_that_never_arrives_gets_408(quick: RouterApp) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 100\r\n\r\n"
    data = await exchange(quick.port, head + b'{"prompt"')
    assert statuses(data) == [408]
    assert closed(quick, "body_timeout") == 1


async def test_a_silent_connection_is_closed_without_an_answer(quick: RouterApp) -> None:
    assert await exchange(quick.port, b"") == b""
    assert closed(quick, "header_timeout") == 1


async def test_an_idle_keep_alive_connection_is_closed(quick: RouterApp) -> None:
    data = await exchange(quick.port, b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n")
    assert statuses(data) == [200]  # answered, then closed once idle
    assert closed(quick, "keep_alive_timeout") == 1


async def test_a_client_that_stops_reading_is_dropped_and_its_request_cancelled() -> None:
    flood = StubWorker("flood")
    async with router(flood, **{**LIMITS, "max_response_bytes": 1 << 40}) as app:
        _, writer = await asyncio.open_connection("127.0.0.1", app.port)
        writer.write(completion())  # and never read the endless answer
        await eventually_async(
            lambda: closed(app, "send_timeout") == 1, what="the stalled client dropped"
        )
        await eventually_async(lambda: flood.in_progress == 0, what="the upstream cancelled")
        assert all(w.in_flight == 0 for w in app.registry.workers)
        writer.close()


# ------------------------------------------------------------------ connection budget


async def test_thousands_of_idle_connections_lock_out_no_client_and_no_probe() -> None:
    workers = (StubWorker(), StubWorker())
    async with router(*workers, max_connections=300) as app:
        checks_before = [w.health_successes for w in app.registry.workers]
        sockets = []
        for i in range(3000):  # idle, and every tenth a slowloris with half a head
            _, writer = await asyncio.open_connection("127.0.0.1", app.port)
            if i % 10 == 0:
                writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: r\r\n")
            sockets.append(writer)
        assert len(app.book.open) <= 300
        # each closed to make room, or, where opening 3,000 took longer than the head's
        # timeout (a loaded machine), for sending no head in time
        assert closed(app, "evicted") + closed(app, "header_timeout") >= 2700
        assert await served(app) == 200
        assert await served(app, app.metrics_port, "/readiness") == 200
        await eventually_async(
            lambda: all(
                w.health_successes > before + 3
                for w, before in zip(app.registry.workers, checks_before, strict=True)
            ),
            what="health checks still passing",
        )
        assert all(w.healthy and w.health_failures == 0 for w in app.registry.workers)
        for writer in sockets:
            writer.close()


async def test_when_every_connection_is_busy_a_newcomer_gets_503_but_probes_pass() -> None:
    hang = StubWorker("hang")
    async with router(hang, max_connections=2) as app:
        busy = [asyncio.ensure_future(exchange(app.port, closing())) for _ in range(2)]
        await eventually_async(lambda: hang.in_progress == 2, what="two requests in hand")
        data = await exchange(app.port, completion())
        assert statuses(data) == [503]
        assert b"retry-after: 1" in data
        assert closed(app, "refused") == 1
        assert await served(app, app.metrics_port, "/readiness") == 200
        hang.release.set()
        assert [statuses(d) for d in await asyncio.gather(*busy)] == [[200], [200]]


async def test_over_max_in_flight_a_request_gets_503_with_retry_after() -> None:
    hang = StubWorker("hang")
    async with router(hang, max_in_flight=2) as app:
        busy = [asyncio.ensure_future(exchange(app.port, closing())) for _ in range(2)]
        await eventually_async(lambda: hang.in_progress == 2, what="two requests in flight")
        data = await exchange(app.port, completion(extra=b"connection: close\r\n"))
        assert statuses(data) == [503]
        assert b"retry-after: 1" in data
        assert b"--max-in-flight" in data
        hang.release.set()
        await asyncio.gather(*busy)
        assert app.pipeline.in_flight == 0


# ------------------------------------------------------------------ methods and protocols


async def test_head_gets_the_head_alone(quick: RouterApp) -> None:
    data = await exchange(
        quick.port,
        b"HEAD /health HTTP/1.1\r\nhost: r\r\n\r\n"
        b"GET /health HTTP/1.1\r\nhost: r\r\nconnection: close\r\n\r\n",
    )
    assert statuses(data) == [200, 200]
    assert data.count(b'{"status":"ok"}') == 1  # the GET's body only
    assert data.count(b"content-length: 15") == 2


async def test_an_upgrade_gets_one_plain_answer_and_the_connection_closes(
    quick: RouterApp,
) -> None:
    data = await exchange(
        quick.port,
        b"GET /health HTTP/1.1\r\nhost: r\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n"
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    )
    assert statuses(data) == [200]
    assert b"connection: close" in data


async def test_connect_gets_one_405(quick: RouterApp) -> None:
    data = await exchange(
        quick.port, b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n"
    )
    assert statuses(data) == [405]


# ------------------------------------------------------------------ what workers send back


async def test_a_worker_answer_over_the_cap_is_502() -> None:
    big = StubWorker("big", big_bytes=100_000)
    async with router(big, **LIMITS) as app:
        data = await exchange(app.port, completion(extra=b"connection: close\r\n"))
        assert statuses(data) == [502]
        assert b"over the router's limit of 8192 bytes" in data
        errors = app.metrics.registry.get_sample_value(
            "tpuserve_router_upstream_errors_total",
            {"worker": app.registry.workers[0].name, "reason": "response_too_large"},
        )
        assert errors == 1


async def test_an_endless_stream_is_cut_with_an_error_event() -> None:
    flood = StubWorker("flood")
    async with router(flood, **LIMITS) as app:
        data = await exchange(app.port, completion())
        assert statuses(data) == [200]
        assert data.rstrip().endswith(b"0")  # the chunked body was ended
        assert b'"type":"upstream_error"' in data
        assert b"over the router's limit of 8192 bytes" in data
        await eventually_async(lambda: flood.in_progress == 0, what="the upstream cancelled")


async def test_headers_the_connection_header_names_are_not_forwarded() -> None:
    """Issue 57 item 9: ``Connection: x-hop`` makes ``x-hop`` hop-by-hop (RFC 9110 7.6.1):
    the router, a proxy, must not pass it to the worker; other headers go on."""
    worker = StubWorker()
    async with router(worker) as app:
        extra = b"connection: close, X-Hop\r\nx-hop: secret\r\nx-kept: yes\r\n"
        assert statuses(await exchange(app.port, completion(extra=extra))) == [200]
        names = [name for name, _ in worker.headers[-1]]
        assert b"x-kept" in names
        assert b"x-hop" not in names
        assert b"connection" not in names
