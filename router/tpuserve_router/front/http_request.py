"""One request on the router's HTTP/1.1 front and the progress of its response (`HttpRequest`),
the shapes of the handlers a listener runs (`Handler`, `HeadCheck`, `ClientOf`) and the
status lines it writes. The connection it arrived on is `server.HttpConnection`, seen here
through `Connection`, what a request uses of it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Protocol

from tpuserve_router.pipeline.request_body import ClientError

_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Unknown"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {phrase}\r\n".encode()
    return line


class Connection(Protocol):
    """What a request uses of the connection it arrived on (`server.HttpConnection`)."""

    transport: asyncio.Transport | None
    closed: bool
    local: bool
    """It came through a listener bound to a loopback address."""

    @property
    def write_paused(self) -> bool: ...

    def peer_host(self) -> str: ...

    async def drain(self) -> None: ...


class HttpRequest:
    """One request and the progress of its response (uvicorn's request-response cycle).

    ``keep_alive`` starts as the client asked and turns false once a response says
    ``connection: close``; ``finished`` is true once the whole response is written.
    """

    __slots__ = (
        "_conn",
        "arrived",
        "body",
        "charged",
        "client",
        "extra_headers",
        "finished",
        "head_only",
        "head_sent",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
    )

    def __init__(
        self,
        conn: Connection,
        method: bytes,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
        arrived: float,
    ) -> None:
        path, _, query = url.partition(b"?")
        self._conn = conn
        self.method = method
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.arrived = arrived
        self.head_sent = False
        self.finished = False
        self.head_only = method == b"HEAD"
        self.extra_headers = b""  # added to the response's head (e.g. rate-limit headers)
        self.charged = 0  # bytes of the buffer budget its body holds (given back once answered)
        self.client: str | None = None  # whose share of the budget they are charged to

    def header(self, name: bytes) -> bytes | None:
        """The first header called ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    # ------------------------------------------------------------------ writing the response

    def respond(self, status: int, headers: bytes, body: bytes, *, keep_alive: bool = True) -> None:
        """Send a whole response; ``headers`` are pre-encoded ``name: value\\r\\n`` lines."""
        conn = self._conn
        transport = conn.transport
        if conn.closed or transport is None or self.head_sent:
            return
        self.head_sent = self.finished = True
        keep = keep_alive and self.keep_alive
        self.keep_alive = keep
        connection = b"" if keep else b"connection: close\r\n"
        transport.write(
            b"".join(
                (
                    status_line(status),
                    headers,
                    self.extra_headers,
                    connection,
                    b"content-length: ",
                    str(len(body)).encode(),
                    b"\r\n\r\n",
                    b"" if self.head_only else body,
                )
            )
        )

    def start_chunked(self, status: int, headers: bytes) -> None:
        conn = self._conn
        transport = conn.transport
        if conn.closed or transport is None or self.head_sent:
            return
        self.head_sent = True
        connection = b"" if self.keep_alive else b"connection: close\r\n"
        transport.write(
            status_line(status)
            + headers
            + self.extra_headers
            + connection
            + b"transfer-encoding: chunked\r\n\r\n"
        )

    def write_chunk(self, data: bytes) -> None:
        conn = self._conn
        if data and not conn.closed and conn.transport is not None:
            conn.transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end_chunked(self, *, keep_alive: bool = True) -> None:
        conn = self._conn
        if conn.closed or conn.transport is None:
            return
        self.finished = True
        conn.transport.write(b"0\r\n\r\n")
        if not keep_alive:
            self.keep_alive = False

    @property
    def write_paused(self) -> bool:
        """The client reads slower than the response is written: ``await drain()``."""
        return self._conn.write_paused

    @property
    def local(self) -> bool:
        """The request came through a listener bound to a loopback address: only processes
        of this host (this pod) reach it. The client's own address proves nothing: a proxy
        on this host (a service-mesh sidecar) dials from a loopback address too."""
        return self._conn.local

    @property
    def peer_host(self) -> str:
        """The client's address as the router sees it ("" when unknown)."""
        return self._conn.peer_host()

    async def drain(self) -> None:
        await self._conn.drain()


Handler = Callable[[HttpRequest], Awaitable[None]]
HeadCheck = Callable[[bytes, bytes, list[tuple[bytes, bytes]], bool], ClientError | None]
"""Run once a request's head has arrived, before its body is read: given the method, the URL,
the headers and whether the listener is local, the refusal to answer at once, or None."""
ClientOf = Callable[[list[tuple[bytes, bytes]], str], str]
"""Who a request that passed the head check is, for its share of the buffer budget: given
its headers and the client's address, a name (its key's tenant, its address)."""


class BodyNotTaken(ClientError):
    """A head check's answer to a request with a body on a route that takes none (404, 405,
    400): answered before the body is read, the connection closed (``unexpected_body``)."""
