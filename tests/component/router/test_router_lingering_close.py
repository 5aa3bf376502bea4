"""The lingering close after a refusal at the head, over raw sockets: a client refused (401)
while it still sends its body reads its answer if it keeps sending, however long past
`--body-timeout` that takes, while a client that drips is cut (``linger_cut``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.fakes import StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.front.server import LINGER_MIN_BYTES_PER_SECOND

pytestmark = pytest.mark.component

BODY_TIMEOUT = 0.5  # seconds: a steady upload below outlasts it many times over
BODY_BYTES = 4 * 1024 * 1024


def closed(app: RouterApp, reason: str) -> float:
    value = app.metrics.registry.get_sample_value(
        "tpuserve_router_connections_closed_total", {"reason": reason}
    )
    return value or 0.0


def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys.json"
    path.write_bytes(orjson.dumps({"keys": [{"key": "sk-good-0123456789abcdef", "tenant": "a"}]}))
    return str(path)


def unauthenticated_head() -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % BODY_BYTES
    )


async def upload(writer: asyncio.StreamWriter, chunk: int, pause: float, total: int) -> None:
    sent = 0
    while sent < total:
        piece = min(chunk, total - sent)
        writer.write(b"x" * piece)
        await writer.drain()
        sent += piece
        await asyncio.sleep(pause)


async def test_a_refused_client_uploading_steadily_past_the_body_timeout_reads_its_401(
    tmp_path: Path,
) -> None:
    # 4 MiB at 64 KiB every 20 ms (about 3 MiB/s, 48x the floor): some 1.3 s, well past the
    # 0.5 s body timeout. Closing at the timeout would reset the connection and destroy the
    # 401 the client reads only after its whole body, as an HTTP/1.1 client does.
    async with stub_router(
        StubWorker(), api_keys_file=keys_file(tmp_path), body_timeout_seconds=BODY_TIMEOUT
    ) as app:
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        writer.write(unauthenticated_head())
        await upload(writer, 64 * 1024, 0.02, BODY_BYTES)
        answer = await asyncio.wait_for(reader.read(), timeout=30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:80]
        assert closed(app, "unauthorized") == 1
        assert closed(app, "linger_cut") == 0


async def test_a_refused_client_that_drips_is_cut_after_the_body_timeout(tmp_path: Path) -> None:
    # One byte every 50 ms: far below the floor, so past the body timeout the router stops
    # reading and closes; its input is not dropped for ever.
    assert LINGER_MIN_BYTES_PER_SECOND > 20
    async with stub_router(
        StubWorker(), api_keys_file=keys_file(tmp_path), body_timeout_seconds=BODY_TIMEOUT
    ) as app:
        _reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
        writer.write(unauthenticated_head())
        drip = asyncio.ensure_future(upload(writer, 1, 0.05, BODY_BYTES))
        try:
            await eventually_async(
                lambda: closed(app, "linger_cut") == 1, what="the drip cut", timeout_seconds=30
            )
        finally:
            drip.cancel()
            await asyncio.gather(drip, return_exceptions=True)
            writer.close()
        assert closed(app, "unauthorized") == 1
