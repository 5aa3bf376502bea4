"""Answers the router writes itself: JSON errors, and the event that ends a broken stream
(the refusals they answer are `refusals`)."""

from __future__ import annotations

import orjson

from tpuserve_router.front.server import JSON_HEADERS, HttpRequest
from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.pipeline.request_body import ClientError


def reply_error(request: HttpRequest, err: ClientError) -> None:
    """Answer ``err``: its status, its headers and an OpenAI-style JSON error body."""
    headers = JSON_HEADERS + b"".join(
        f"{k}: {v}\r\n".encode("latin-1") for k, v in err.headers.items()
    )
    request.respond(err.status, headers, err.body())


def reject(
    request: HttpRequest,
    err: ClientError,
    metrics: RouterMetrics,
    route: str,
    model: str = "",
    worker: str = "none",
) -> None:
    """Answer ``err`` and count it in ``tpuserve_router_requests_total``."""
    reply_error(request, err)
    metrics.requests.labels(model, worker, route, str(err.status)).inc()


def sse_error_event(message: str, status: int = 502) -> bytes:
    """The SSE event that ends a stream whose worker failed mid-way."""
    error = {"message": message, "type": "upstream_error", "param": None, "code": status}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"
