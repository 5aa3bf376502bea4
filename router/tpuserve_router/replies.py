"""Answers the router writes itself: JSON errors, and the event that ends a broken stream."""

from __future__ import annotations

import orjson

from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.request_body import ClientError
from tpuserve_router.server import JSON_HEADERS, RETRY_AFTER_SECONDS, HttpRequest


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


def model_not_found(name: str, served: list[str]) -> ClientError:
    """OpenAI's 404 for a model (or adapter) no worker serves, listing what is served."""
    return ClientError(
        404,
        f"The model {name} does not exist or is not served by this router; "
        f"available: {', '.join(served) or 'none'}",
        param="model",
        error_type="invalid_request_error",
        code="model_not_found",
    )


def sse_error_event(message: str, status: int = 502) -> bytes:
    """The SSE event that ends a stream whose worker failed mid-way."""
    error = {"message": message, "type": "upstream_error", "param": None, "code": status}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


def unauthorized(presented: bytes | None) -> ClientError:
    """The 401 for a request without a valid API key (OpenAI's shape and wording)."""
    message = (
        "Incorrect API key provided."
        if presented
        else "You didn't provide an API key: send Authorization: Bearer KEY."
    )
    return ClientError(
        401,
        message,
        error_type="invalid_request_error",
        headers={"www-authenticate": "Bearer"},
    )


def unavailable(message: str) -> ClientError:
    """A 503 with Retry-After: the router cannot take the request now (overload, no worker,
    the hold queue full or the hold time over)."""
    return ClientError(
        503,
        message,
        error_type="service_unavailable",
        headers={"retry-after": RETRY_AFTER_SECONDS},
    )
