"""Mode live's client records why a request failed, whatever the router answered."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tpuserve.bench.live_runner import send_request
from tpuserve.bench.report import RequestRecord, summarize
from tpuserve.bench.traces import TraceRequest

pytestmark = pytest.mark.unit


async def refused(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "no healthy worker"}}, status=503)


async def error_chunk(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(b'data: {"error": {"message": "engine died"}}\n\n')
    return resp


async def only_done(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def cut_short(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    resp.content_length = 1000  # promises more than it sends, then the connection closes
    await resp.prepare(request)
    await resp.write(b'data: {"choices": [{"text": " a"}]}\n\n')
    assert request.transport is not None
    request.transport.close()
    return resp


async def ok(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(b'data: {"choices": [{"text": " a"}]}\n\n')
    usage = b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
    await resp.write(b"data: " + usage + b"\n\ndata: [DONE]\n\n")
    return resp


@pytest.mark.parametrize(
    ("handler", "reason", "detail"),
    [
        (refused, "http_503", "no healthy worker"),
        (error_chunk, "stream_error", "engine died"),
        (only_done, "no_data", ""),
        (cut_short, "ClientPayloadError", ""),
        (ok, "", ""),
    ],
)
async def test_each_failure_is_recorded_with_its_reason(
    aiohttp_server: Any, handler: Any, reason: str, detail: str
) -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    server: TestServer = await aiohttp_server(app)
    req = TraceRequest("r1", 0.0, 2, prompt="hello")
    rec = RequestRecord("r1", "", 0.0, 3)
    async with aiohttp.ClientSession() as session:
        await send_request(session, f"http://127.0.0.1:{server.port}", req, rec, 0.0)
    assert rec.failure_reason == reason
    assert detail in rec.error_detail
    summary = summarize("p", [rec], None, warmup_fraction=0.0)
    assert summary["failed_by_reason"] == ({reason: 1} if reason else {})
