"""The router's HTTP/1.1 front: an asyncio protocol parsing requests with httptools.

Why not aiohttp.web: on this project's machines a proxy built this way cost about 56 µs of
CPU per request against about 180 µs on aiohttp's server and client (ARCHITECTURE.md §4).

Two objects, as in uvicorn's protocol/cycle split. `HttpConnection` is one client
connection: the transport, the parser, requests waiting their turn, flow control and the
closing rules. `HttpRequest` (`http_request`) is one request on it and the progress of its
response: it is built once the body is complete and handed to the handler, which reads its
fields and answers through it: ``respond`` for a whole response, or ``start_chunked`` /
``write_chunk`` / ``end_chunked`` to stream, with ``drain`` for back-pressure when the
client reads slowly.

Requests pipelined on one connection are answered in order. What a client may send is
bounded (`FrontLimits`), and an unreadable request is answered and its connection closed
(its remaining bytes cannot be trusted):

- a request line (URL) over ``max_request_line_bytes``: 414;
- a head (request line and headers) over ``max_header_bytes``: 431, counted before the
  parser sees the bytes (httptools joins a header's pieces by concatenation, so a huge
  header would otherwise cost quadratic time); more than ``max_headers`` headers: 431;
- a body over ``max_body_bytes``: 413 as soon as the declared length (or the received
  body) shows it; a body that does not fit in the router-wide budget of buffered request
  bytes (`connections.BufferBudget`), or in the client's share of it (the listener's
  ``client_of`` names the client): 503 with ``Retry-After``, as soon as the declared length
  (or the received body) shows it;
- a request the listener's ``head_check`` refuses (no valid API key, a body on a route that
  takes none, say): its answer (401, 403, 404, 405) as soon as the head has arrived, before a
  byte of its body is read;
- a head not complete within ``header_timeout_seconds`` of its first byte (or of the
  connection opening), a body not complete within ``body_timeout_seconds`` of its head:
  408; a keep-alive connection idle for ``keep_alive_timeout_seconds``: closed; a client
  that stops reading a response for ``send_timeout_seconds``: closed (its request is
  cancelled). The listener's `ConnectionBook` runs these timeouts and the connection budget.

``Expect: 100-continue`` is answered (after the head check). A HEAD request is answered
with the head alone. A request asking to switch protocols (``Upgrade``, ``CONNECT``) is
answered as a plain request (the upgrade is ignored, as RFC 9110 allows) and the connection
is then closed. A client that disconnects cancels the handler's task (so the proxy aborts
the upstream request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, cast

import httptools

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.proxy import set_nodelay
from tpuserve_router.engines.worker_networks import is_loopback
from tpuserve_router.front.connections import ConnectionBook
from tpuserve_router.front.http_request import (
    BodyNotTaken,
    ClientOf,
    Handler,
    HeadCheck,
    HttpRequest,
    status_line,
)
from tpuserve_router.front.unix_listener import serve_unix
from tpuserve_router.pipeline.client import JSON_HEADERS
from tpuserve_router.pipeline.refusals import RETRY_AFTER_SECONDS
from tpuserve_router.pipeline.request_body import ClientError, error_body

log = logging.getLogger(__name__)

MAX_PIPELINED = 16
"""Retry-After on a 503 (no healthy worker, router not ready, over a budget)."""

# What a connection is reading: nothing yet (new), nothing between requests (idle), a
# request's head, a request's body; or, answered and half-closed, input to drop (closing).
NEW, IDLE, HEAD, BODY, CLOSING = 0, 1, 2, 3, 4
LINGER_IDLE_SECONDS: Final = 30.0
"""A rejected client's remaining input is read and dropped (nginx's lingering close) until the
client closes, until it has sent nothing for `LINGER_IDLE_SECONDS`, or for at most the time an
accepted body may take (`--body-timeout`): closing with unread input resets the connection,
which destroys the answer before the client reads it, and an HTTP/1.1 client reads the answer
only once it has sent its whole body. nginx's 5 s pause (`lingering_timeout`) is too short for
a client that encodes other requests' bodies between its writes: 40 uploads of 30 MB from one
asyncio process, on two cores kept busy by other work, were reset after 5 s pauses (18 of 40
never read their 401). A lingering connection holds no buffer and is the first evicted when
the connection limit needs room, so a longer wait costs a socket at most."""
LINGER_MIN_BYTES_PER_SECOND: Final = 64 * 1024
"""Past `--body-timeout`, a lingering close goes on while the client has sent at least this much
a second on average since its answer (Apache's ``mod_reqtimeout`` MinRate, for input the router
drops): a client uploading steadily reads its answer however slow a busy machine makes it (40
uploads of 30 MB from one process beside two CPU burners outlasted the 60 s default; their
401s were destroyed by the reset), while a drip is cut (``linger_cut``). It ends at the latest
when a body of `--max-request-bytes` would have arrived at this rate."""


@dataclass(frozen=True, slots=True)
class FrontLimits:
    """What one client may send and hold open; `front_limits` gives the router's (its
    settings and their defaults are the one source)."""

    max_request_line_bytes: int
    max_header_bytes: int
    max_headers: int
    max_body_bytes: int
    max_connections: int
    header_timeout_seconds: float
    body_timeout_seconds: float
    keep_alive_timeout_seconds: float
    send_timeout_seconds: float

    @property
    def tick_seconds(self) -> float:
        """How often the timeouts are checked: a quarter of the shortest."""
        return (
            min(
                self.header_timeout_seconds,
                self.body_timeout_seconds,
                self.keep_alive_timeout_seconds,
                self.send_timeout_seconds,
            )
            / 4
        )


def front_limits(config: RouterConfig, max_connections: int | None = None) -> FrontLimits:
    """The front's limits from the router's settings; ``max_connections`` overrides the
    setting (the app lowers it to what the process's file-descriptor limit allows)."""
    return FrontLimits(
        max_request_line_bytes=config.max_request_line_bytes,
        max_header_bytes=config.max_header_bytes,
        max_headers=config.max_headers,
        max_body_bytes=config.max_request_bytes,
        max_connections=config.max_connections if max_connections is None else max_connections,
        header_timeout_seconds=config.header_timeout_seconds,
        body_timeout_seconds=config.body_timeout_seconds,
        keep_alive_timeout_seconds=config.keep_alive_timeout_seconds,
        send_timeout_seconds=config.send_timeout_seconds,
    )


class HttpConnection(asyncio.Protocol):
    """One client connection: parsing, pipelining, flow control, limits and closing."""

    def __init__(
        self,
        handler: Handler,
        limits: FrontLimits,
        book: ConnectionBook,
        loop: asyncio.AbstractEventLoop,
        head_check: HeadCheck | None = None,
        local: bool = False,
        client_of: ClientOf | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.book = book
        self.buffers = book.buffers
        self.loop = loop
        self.head_check = head_check
        self.local = local
        self.client_of = client_of
        self._client: str | None = None  # whose share the body being read is charged to
        self._peer: str | None = None  # the client's address, read once (`peer_host`)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.pending: deque[HttpRequest] = deque()
        self.task: asyncio.Task[None] | None = None
        self.phase = NEW
        self.since = book.now  # when the phase began (the book's clock)
        self._head_bytes = 0  # bytes received while reading the current head
        self._last: HttpRequest | None = None  # the latest request read
        self._drain: asyncio.Future[None] | None = None
        self._write_paused = False
        self._paused_at = 0.0
        self._last_input = 0.0
        self._dropped = 0  # bytes a lingering close dropped
        self._read_paused = False
        self._ignoring = False  # the rest of the input cannot be trusted
        self._rejection: bytes | None = None
        self._start_message()

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        if not self.book.opened(self):
            self._ignoring = self.closed = True
            self.transport.write(_whole(503, _BUSY, RETRY_AFTER))
            self.transport.close()
            return
        self.since = self.book.now  # opened() may have just refreshed the clock
        set_nodelay(transport)

    def data_received(self, data: bytes | memoryview) -> None:
        if self._ignoring:
            self._last_input = self.book.now  # a lingering close waits for the input to end
            self._dropped += len(data)
            return
        if self.phase != BODY:  # these bytes may belong to a head: count them first
            seen = self._head_bytes + len(data)
            if seen > self.limits.max_header_bytes:
                self._feed_past_head_limit(data)
                return
            self._head_bytes = seen
        try:  # _feed, inlined on the request path
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade_refused()
        except httptools.HttpParserError as err:
            self._malformed(err)
        self._last = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.book.closed(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        for request in self.pending:
            self.buffers.give(request.charged, request.client)
            request.charged = 0
        self.pending.clear()
        self._drop_body()
        # The parser holds this connection's bound callbacks: a cycle only the collector
        # would break, late (the router collects rarely), with the buffers kept until then.
        self.parser = DETACHED_PARSER
        self._start_message()
        waiter = self._drain
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._paused_at = self.book.now
        self.book.stalled.add(self)

    def resume_writing(self) -> None:
        self._write_paused = False
        self.book.stalled.discard(self)
        waiter = self._drain
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ parsing

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade_refused()
        except httptools.HttpParserError as err:
            self._malformed(err)
        self._last = None  # only an upgrade, within this feed, needs the latest request

    def _malformed(self, err: httptools.HttpParserError) -> None:
        self._reject(400, f"malformed HTTP request: {err}", "headers", "malformed")

    def _feed_past_head_limit(self, data: bytes | memoryview) -> None:
        """Feed only what the head limit allows; if the head has not ended by then, 431."""
        limit = self.limits.max_header_bytes
        allowed = max(0, limit - self._head_bytes)
        view = memoryview(data)
        self._head_bytes = -1  # on_headers_complete resets it to 0
        self._feed(view[:allowed])
        if self._ignoring:
            return
        if self._head_bytes != 0:
            self._reject(
                431, f"the request head is larger than the router's limit of {limit} bytes",
                "headers", "head_too_large",
            )  # fmt: skip
            return
        self.data_received(view[allowed:])

    def _upgrade_refused(self) -> None:
        """A request asked to switch protocols: it is answered as a plain HTTP request, and
        the connection closes after it (what follows is in the other protocol)."""
        self._ignoring = True
        if self._last is not None:
            self._last.keep_alive = False

    # ------------------------------------------------------------------ httptools callbacks

    def _start_message(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_size = 0

    def _drop_body(self) -> None:
        """Forget the body being read, and give its bytes back to the budget."""
        self.buffers.give(self._body_size, self._client)
        self._body_size = 0
        self._body = []

    def on_message_begin(self) -> None:
        self.phase = HEAD
        self.since = self.book.now

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.limits.max_request_line_bytes and not self._ignoring:
            self._reject(
                414,
                f"the request URL is longer than the router's limit of "
                f"{self.limits.max_request_line_bytes} bytes",
                "path",
                "url_too_long",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._head_bytes = 0
        self.phase = BODY
        self.since = self.book.now
        if self._ignoring:
            return
        headers = self._headers
        if len(headers) > self.limits.max_headers:
            self._reject(
                431,
                f"the request has {len(headers)} headers; the router's limit is "
                f"{self.limits.max_headers}",
                "headers",
                "too_many_headers",
            )
            return
        if self.head_check is not None:
            refusal = self.head_check(self.parser.get_method(), self._url, headers, self.local)
            if refusal is not None:
                reason = "unexpected_body" if isinstance(refusal, BodyNotTaken) else "unauthorized"
                self._refuse(refusal, reason)
                return
        client = self._client = (
            None if self.client_of is None else self.client_of(headers, self.peer_host())
        )
        continue_ = False
        for name, value in headers:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limits.max_body_bytes:
                    self._reject_too_large(declared)
                    return
                if declared > self.buffers.free_for(client):
                    self._over_budget(declared)
                    return
            elif name == b"expect" and value.lower() == b"100-continue":
                continue_ = True
        if continue_ and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._ignoring:
            return
        size = len(body)
        if self._body_size + size > self.limits.max_body_bytes:
            self._reject_too_large(self._body_size + size)
            return
        if not self.buffers.take(size, self._client):
            self._over_budget(self._body_size + size)
            return
        self._body_size += size
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.phase = IDLE
        if self._ignoring:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = HttpRequest(
            self,
            self.parser.get_method(),
            self._url,
            self._headers,
            body,
            self.parser.should_keep_alive(),
            time.monotonic(),
        )
        request.charged = self._body_size
        request.client = self._client
        self._last = request
        self._start_message()  # the request owns its parts (and its charge); the connection none
        if self.task is None:
            self.book.waiting.pop(self, None)  # book.busy, inlined on the request path
            self._run(request)
        else:
            self.pending.append(request)
            if len(self.pending) >= MAX_PIPELINED and self.transport and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()

    # ------------------------------------------------------------------ one request at a time

    def _run(self, request: HttpRequest) -> None:
        self.task = self.loop.create_task(self._serve(request))

    async def _serve(self, request: HttpRequest) -> None:
        try:
            await self.handler(request)
        except asyncio.CancelledError:
            self.closed = True
            raise
        except Exception:
            log.exception("router bug while answering %s %s", request.method, request.path)
            if not request.head_sent:
                request.respond(
                    500,
                    JSON_HEADERS,
                    error_body(500, "internal router error", None, "internal_error"),
                    keep_alive=False,
                )
            else:
                self.abort()
        finally:
            self.task = None
            self.buffers.give(request.charged, request.client)
            request.charged = 0
        if not request.finished and not self.closed:
            self.abort()  # a handler that never finished its response
            return
        if self.closed:
            return
        if not request.keep_alive:
            self.close()
            return
        if self._rejection is not None and not self.pending and self.transport is not None:
            self.transport.write(self._rejection)
            self._linger()
            return
        if self.pending:
            if self._read_paused and self.transport and len(self.pending) < MAX_PIPELINED:
                self._read_paused = False
                self.transport.resume_reading()
            self._run(self.pending.popleft())
            return
        self.since = self.book.now  # the keep-alive (or a pipelined head's) clock starts now
        self.book.waiting[self] = None  # book.idle, inlined

    def peer_host(self) -> str:
        """The client's address ("" when unknown), read once per connection: each request
        asks for it (its buffer share, its hold queue's tenant, the peers' view)."""
        host = self._peer
        if host is None:
            transport = self.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if transport is not None:
                self._peer = host
        return host

    # ------------------------------------------------------------------ flow control, closing

    @property
    def write_paused(self) -> bool:
        return self._write_paused

    async def drain(self) -> None:
        while self._write_paused and not self.closed:
            waiter = self.loop.create_future()
            self._drain = waiter
            try:
                await waiter
            finally:
                self._drain = None

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ timeouts, eviction

    def expired(self, now: float) -> str | None:
        """Close the connection if a timeout passed (`ConnectionBook.sweep` asks)."""
        if self.phase == CLOSING:
            if now - self._last_input > LINGER_IDLE_SECONDS:
                self.abort()  # the client went quiet: its answer had time to arrive
                return "linger_quiet"
            lingered = now - self.since
            if lingered > self.limits.body_timeout_seconds and (
                self._dropped < LINGER_MIN_BYTES_PER_SECOND * lingered
                or lingered
                > self.limits.body_timeout_seconds
                + self.limits.max_body_bytes / LINGER_MIN_BYTES_PER_SECOND
            ):
                self.abort()
                return "linger_cut"
            return None
        if self.closed:
            return None
        limits = self.limits
        if self.task is not None:  # busy: only a client that stopped reading is timed
            if self._write_paused and now - self._paused_at > limits.send_timeout_seconds:
                self.abort()
                return "send_timeout"
            return None
        waited = now - self.since
        phase = self.phase
        if phase == IDLE:
            if waited > limits.keep_alive_timeout_seconds:
                self.close()
                return "keep_alive_timeout"
        elif phase == NEW:
            if waited > limits.header_timeout_seconds:
                self.close()
                return "header_timeout"
        elif phase == HEAD:
            if waited > limits.header_timeout_seconds:
                self._time_out("head", limits.header_timeout_seconds)
                return "header_timeout"
        elif waited > limits.body_timeout_seconds:
            self._time_out("body", limits.body_timeout_seconds)
            return "body_timeout"
        return None

    def evict(self) -> None:
        self.abort()

    def _time_out(self, part: str, seconds: float) -> None:
        self._ignoring = True
        self._drop_body()
        message = f"the request {part} did not arrive within {seconds:g} s"
        if self.transport is not None:
            self.transport.write(_whole(408, error_body(408, message, part, "timeout")))
        self._linger()

    def _linger(self) -> None:
        """Half-close after an error answer and drop what the client still sends, for
        a while (`LINGER_IDLE_SECONDS`); then the sweep closes the connection."""
        self._ignoring = True
        transport = self.transport
        if transport is None or self.closed:
            return
        if not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        self.closed = True  # nothing more is written
        self.phase = CLOSING
        self.since = self._last_input = self.book.now
        self._dropped = 0
        self.book.idle(self)

    # ------------------------------------------------------------------ rejections

    def _reject_too_large(self, size: int) -> None:
        self._reject(
            413,
            f"the request body ({size} bytes) is larger than the router's limit of "
            f"{self.limits.max_body_bytes} bytes",
            "body",
            "body_too_large",
        )

    def _over_budget(self, size: int) -> None:
        budget = self.buffers
        client = self._client
        held = budget.by_client.get(client, 0) if client is not None else 0
        if client is not None and budget.free_for(client) < budget.free:
            message = (
                f"this client ({client}) holds {held} bytes of requests, its share is "
                f"{budget.max_client_bytes} (--max-buffered-bytes-per-client), and this body "
                f"({size} bytes) does not fit; retry"
            )
        else:
            message = (
                f"the router holds {budget.used} bytes of requests, its limit is "
                f"{budget.max_bytes} (--max-buffered-bytes), and this body ({size} bytes) "
                "does not fit; retry"
            )
        self._refuse(
            ClientError(
                503,
                message,
                param="body",
                error_type="service_unavailable",
                headers={"retry-after": RETRY_AFTER_SECONDS},
            ),
            "buffer_budget",
        )

    def _refuse(self, err: ClientError, reason: str) -> None:
        """Answer ``err`` without reading the request's body, and close."""
        headers = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in err.headers.items())
        self._close_with(_whole(err.status, err.body(), headers), reason)

    def _reject(self, status: int, message: str, param: str, reason: str) -> None:
        """Answer an unreadable request and close: its remaining bytes cannot be trusted;
        ``reason`` is counted (a label of ``tpuserve_router_connections_closed_total``)."""
        answer = _whole(status, error_body(status, message, param, "invalid_request_error"))
        self._close_with(answer, reason)

    def _close_with(self, answer: bytes, reason: str) -> None:
        self._ignoring = True
        self._drop_body()
        self.book.count(reason)
        if self.transport is None or self.closed:
            return
        if self.task is None:
            self.transport.write(answer)
            self._linger()
        else:  # answer the requests already read, then this one, then close
            self._rejection = answer


class _NoCallbacks:
    """The protocol of `DETACHED_PARSER`: nothing to call."""


DETACHED_PARSER: Final = httptools.HttpRequestParser(_NoCallbacks())
"""What a closed connection holds instead of its parser (see `connection_lost`)."""

RETRY_AFTER: Final = b"retry-after: " + RETRY_AFTER_SECONDS.encode() + b"\r\n"
_BUSY: Final = error_body(
    503, "the router is at its connection limit; retry", None, "service_unavailable"
)


def _whole(status: int, body: bytes, headers: bytes = b"") -> bytes:
    return b"".join(
        (
            status_line(status),
            JSON_HEADERS,
            headers,
            b"connection: close\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n\r\n",
            body,
        )
    )


async def serve(
    handler: Handler,
    host: str,
    port: int,
    limits: FrontLimits,
    book: ConnectionBook | None = None,
    head_check: HeadCheck | None = None,
    client_of: ClientOf | None = None,
    uds: str | None = None,
) -> asyncio.Server:
    """Listen on ``host:port`` (port 0 = a free port), or on the unix socket ``uds`` when
    given (`serve_unix`; its requests are not `HttpRequest.local`: a socket file's reach is
    its mode, not this host's loopback); the caller closes the server.

    Connections are counted, timed and closed under pressure by ``book`` (one of its own
    if none is given), their bodies charged to its buffer budget; ``head_check`` may refuse
    a request once its head has arrived, ``client_of`` names whose share of the budget a body
    is charged to (None: no client's). Requests know whether ``host`` is a loopback
    address (`HttpRequest.local`).
    """
    loop = asyncio.get_running_loop()
    if book is None:
        book = ConnectionBook(limits.max_connections, limits.tick_seconds)
    local = is_loopback(host) and uds is None

    def factory() -> HttpConnection:
        return HttpConnection(handler, limits, book, loop, head_check, local, client_of)

    if uds is not None:
        return await serve_unix(factory, uds)
    return await loop.create_server(factory, host, port, reuse_address=True, backlog=1024)
