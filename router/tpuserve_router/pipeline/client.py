"""The client a relay answers, as the pipeline sees it (the HTTP port's `HttpRequest` is
one), and the answers the router writes to it itself: JSON errors, and the event that ends a
broken stream (the refusals they answer are `refusals`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

import orjson

from tpuserve_router.pipeline.request_body import ClientError

JSON_HEADERS: Final = b"content-type: application/json\r\n"


class Client(Protocol):
    """A request as it came (its method, target, headers and body) and its answer's way
    back: whole (`respond`) or chunked (`start_chunked`, `write_chunk`, `end_chunked`)."""

    method: bytes
    path: str
    query: str
    body: bytes
    arrived: float
    extra_headers: bytes
    """Added to its answer's head (its key's rate-limit headers)."""

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    def respond(
        self, status: int, headers: bytes, body: bytes, *, keep_alive: bool = True
    ) -> None: ...

    def start_chunked(self, status: int, headers: bytes) -> None: ...

    def write_chunk(self, data: bytes) -> None: ...

    def end_chunked(self, *, keep_alive: bool = True) -> None: ...

    @property
    def write_paused(self) -> bool: ...

    async def drain(self) -> None: ...


def reply_error(client: Client, err: ClientError) -> None:
    """Answer ``err``: its status, its headers and an OpenAI-style JSON error body."""
    headers = JSON_HEADERS + b"".join(
        f"{k}: {v}\r\n".encode("latin-1") for k, v in err.headers.items()
    )
    client.respond(err.status, headers, err.body())


def sse_error_event(message: str, status: int = 502) -> bytes:
    """The SSE event that ends a stream whose worker failed mid-way."""
    error = {"message": message, "type": "upstream_error", "param": None, "code": status}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"
