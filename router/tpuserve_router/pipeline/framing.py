"""How a request and its answer are framed on their way through the router (HTTP/1.1): the
hop-by-hop headers dropped both ways (RFC 9110 7.6.1), the upstream request line and host,
whether an answer is chunked. The colocated relay and a pair's legs
frame alike (`relay`, `pair_relay`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

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


NONE_NAMED: Final = frozenset[bytes]()


def connection_named(headers: Sequence[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The headers a ``Connection`` header names: hop-by-hop as well (RFC 9110 7.6.1), not
    passed on (names lower case)."""
    named = NONE_NAMED
    for name, value in headers:  # most requests and answers have none: no list built
        if name == b"connection":
            tokens = (token.strip().lower() for token in value.split(b","))
            named = named.union(token for token in tokens if token)
    return named


def forwarded_headers(request: Client, body: bytes, dropped: frozenset[bytes]) -> bytes:
    """The client's headers but ``dropped`` and those its ``Connection`` names, and ``body``,
    framed: all of a request after its host."""
    named = connection_named(request.headers)
    if named:
        dropped = dropped | named
    return b"".join(
        [name + b": " + value + b"\r\n" for name, value in request.headers if name not in dropped]
        + [b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body]
    )


def upstream_request(request: Client, host: bytes, headers_and_body: bytes) -> bytes:
    target = request.path.encode("latin-1")
    if request.query:
        target += b"?" + request.query.encode("latin-1")
    return b"".join(
        (request.method, b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n", headers_and_body)
    )


def response_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Upstream response headers to pass on (names arrive lower-cased from the proxy): not
    the hop-by-hop ones, nor those its ``Connection`` names."""
    named = connection_named(headers)
    dropped = HOP_BY_HOP | named if named else HOP_BY_HOP
    return b"".join(
        [name + b": " + value + b"\r\n" for name, value in headers if name not in dropped]
    )


def is_chunked(upstream: UpstreamConnection) -> bool:
    value = upstream.header(b"transfer-encoding")
    return value is not None and b"chunked" in value.lower()
