"""Upstream connections on a loopback socket: the deadlines of requests sharing a kept-alive
connection, which share its one timer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.front.http_request import HttpRequest
from tpuserve_router.front.server import front_limits, serve

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
    server = await serve(worker, "127.0.0.1", 0, front_limits(RouterConfig()))
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


@pytest.mark.parametrize(("verdict", "silent"), [(False, True), (None, False), (True, False)])
async def test_only_a_worker_that_failed_its_probes_is_silent_at_the_floor(
    pool: UpstreamPool, verdict: bool | None, silent: bool
) -> None:
    """Past the floor (0.05 s) a worker whose probe failed (False) is failed at once and
    called ``silent`` (its request's retry spends no budget); one with nothing known (None)
    or a passed probe (True) is waited for up to its first-byte time (0.3 s), and a failure
    then says nothing about it."""
    conn = await pool.connect()
    try:
        conn.send(b"GET /late HTTP/1.1\r\nhost: h\r\n\r\n")
        conn.set_deadlines(0.3, LONG, LONG, alive=(0.05, lambda: verdict))
        with pytest.raises(UpstreamError) as failed:
            async with asyncio.timeout(5):
                await conn.wait_head()
    finally:
        pool.release(conn)
    assert failed.value.reason == "first_byte_timeout"
    assert failed.value.silent is silent
    assert ("no health probe passed" in failed.value.detail) is silent


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


def test_a_first_byte_deadline_off_the_timer_grid_still_fires_on_time() -> None:
    """Issue 57 item 8: uvloop's clock and timers step in whole milliseconds, and a deadline
    of ``now + seconds`` is a float a hair past its millisecond about one time in eight.
    The timer then fires at that millisecond, a hair before the deadline: the check used to
    take that for "not yet" and look again one idle period later (``stream_idle_timeout``,
    30 s by default), so a hung worker held those requests until the client left. Forty
    requests on the router's own loop, to a worker that answers only after 2 s: every one
    must fail at its first-byte deadline."""
    import uvloop

    async def main() -> None:
        server = await serve(worker, "127.0.0.1", 0, front_limits(RouterConfig()))
        pool = UpstreamPool(
            "127.0.0.1", server.sockets[0].getsockname()[1], connect_timeout_seconds=5,
            max_idle=64, max_head_bytes=1 << 16, max_body_bytes=1 << 20,
        )  # fmt: skip
        conns: list[UpstreamConnection] = []
        loop = asyncio.get_running_loop()

        async def off_grid_seconds(index: int) -> float:
            """About 50 ms plus ``index`` ms, such that now + it lies past its millisecond
            (not every ``now`` has one near: then a millisecond later)."""
            while True:
                now = loop.time()
                for i in range(100):
                    seconds = 0.05 + (index + i) / 1000
                    if round((now + seconds) * 1000) / 1000 < now + seconds:
                        return seconds
                await asyncio.sleep(0.001)

        async def one(index: int) -> str:
            conn = await pool.connect()
            conns.append(conn)
            try:
                conn.send(b"GET /late HTTP/1.1\r\nhost: h\r\n\r\n")
                conn.set_deadlines(await off_grid_seconds(index), LONG, LONG)
                await conn.wait_head()
                return "answered"
            except UpstreamError as err:
                return err.reason
            finally:
                pool.release(conn)

        try:
            reasons = await asyncio.gather(*(one(i) for i in range(40)))
        finally:
            server.close()
            await server.wait_closed()
        # the case this is about happened (else the test proves nothing): a deadline past
        # the millisecond its timer fires at
        assert any(round(c._first_byte_at * 1000) / 1000 < c._first_byte_at for c in conns)
        assert reasons == ["first_byte_timeout"] * 40

    uvloop.run(main())
