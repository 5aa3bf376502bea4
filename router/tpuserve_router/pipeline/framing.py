"""How a request and its answer are framed on their way through the router (HTTP/1.1): the
hop-by-hop headers dropped both ways (RFC 9110 7.6.1), the upstream request line and host,
whether an answer is chunked. The colocated relay and a pair's legs
frame alike (`relay`, `pair_relay`)."""

from __future__ import annotations

from typing import Final

from tpuserve_router._native import pass_on
from tpuserve_router.engines.proxy import UpstreamConnection
from tpuserve_router.pipeline.client import Client

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"expect",
    }
)
CREDENTIALS: Final = frozenset({b"authorization", b"x-api-key"})


def forwarded_headers(request: Client, body: bytes, dropped: frozenset[bytes]) -> bytes:
    """The client's headers but ``dropped`` and those its ``Connection`` names, and ``body``,
    framed: all of a request after its host (`_native.pass_on`: one call on every request,
    where a comprehension, the scan for ``Connection`` and the join were a frame each)."""
    return pass_on(request.headers, dropped, body)


def upstream_request(request: Client, host: bytes, headers_and_body: bytes) -> bytes:
    target = request.path.encode("latin-1")
    if request.query:
        target += b"?" + request.query.encode("latin-1")
    return b"".join(
        (request.method, b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n", headers_and_body)
    )


def response_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Upstream response headers to pass on (names arrive lower-cased from the proxy): not
    the hop-by-hop ones, nor those its ``Connection`` names (`_native.pass_on`)."""
    return pass_on(headers, HOP_BY_HOP)


def is_chunked(upstream: UpstreamConnection) -> bool:
    value = upstream.header(b"transfer-encoding")
    return value is not None and b"chunked" in value.lower()
