"""The refusals the router answers itself, as `ClientError`s any front can answer (the HTTP
port as JSON errors, `replies`; the picker as an ``ImmediateResponse``): a model not served,
a missing or wrong API key, no room now (503 with Retry-After)."""

from __future__ import annotations

from typing import Final

from tpuserve_router.pipeline.request_body import ClientError

RETRY_AFTER_SECONDS: Final = "1"
"""What a 503 the router answers asks the client to wait (``Retry-After``)."""


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
