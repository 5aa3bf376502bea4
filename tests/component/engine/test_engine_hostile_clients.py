"""A twin facing broken clients: a body that never arrives gets 408 and a closed connection,
malformed HTTP or a client gone mid-body is one INFO line in the log, not a traceback, and
the debug endpoint (cached token ids) is off unless asked for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.component.engine.engine_process import EngineProcess, running_engine

pytestmark = pytest.mark.component


async def exchange(engine: EngineProcess, data: bytes, *, close_early: bool = False) -> bytes:
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    if close_early:
        writer.close()
        return b""
    try:
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_broken_clients_get_an_answer_and_one_log_line(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    args = ["--time-scale", "0", "--body-timeout-seconds", "0.3"]
    with running_engine(args, log=log) as engine:
        declared = b"POST /generate HTTP/1.1\r\nhost: e\r\ncontent-length: 100\r\n\r\n{"
        answer = await exchange(engine, declared)
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"did not arrive within 0.3 s" in answer
        bad = await exchange(engine, b"GET / HTTP/1.1\r\nhost: e\r\nbad header\r\n\r\n")
        assert bad.startswith(b"HTTP/1.0 400") or bad.startswith(b"HTTP/1.1 400")
        await exchange(engine, declared, close_early=True)  # gone mid-body
        debug = await exchange(engine, b"GET /debug/radix_cache HTTP/1.1\r\nhost: e\r\n"
                               b"connection: close\r\n\r\n")  # fmt: skip
        assert debug.startswith(b"HTTP/1.1 404")  # cached token ids: only when asked for
        await asyncio.sleep(0)  # let the engine log what it logs; it is read after it stops
        engine.terminate()
    text = log.read_text()
    assert "Traceback" not in text
    assert "ERROR" not in text
    assert "INFO aiohttp.server: Error handling request" in text
