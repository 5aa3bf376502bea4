"""Response builders of the twin's HTTP API: JSON bodies, OpenAI error objects, SSE streams."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

RETRY_AFTER_SECONDS = "1"


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


VALIDATION_ERROR_TYPE = "Bad Request"
"""The OpenAI error ``type`` of a body SGLang's request schema refuses (FastAPI's validation
handler), on every route; errors its serving code raises are typed by status instead."""


def openai_error(
    message: str,
    status: int,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    error_type: str | None = None,
) -> web.Response:
    """An OpenAI error object; `error_type` defaults to the status's error class."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    return json_response(
        {
            "object": "error",
            "message": message,
            "type": error_type or kind.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        },
        status=status,
        headers=headers,
    )


def unavailable(message: str) -> web.Response:
    """503 with Retry-After: draining, or the waiting queue is full."""
    return openai_error(message, 503, headers={"Retry-After": RETRY_AFTER_SECONDS})


async def sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


async def sse_event(resp: web.StreamResponse, data: Any) -> None:
    await resp.write(b"data: " + orjson.dumps(data) + b"\n\n")


async def sse_done(resp: web.StreamResponse) -> web.StreamResponse:
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
