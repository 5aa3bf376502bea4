"""Pooled raw HTTP/1.1 connections to one worker, parsed with httptools.

`UpstreamPool.open()` takes an idle keep-alive connection (`take_idle`) or dials a new one
(TCP_NODELAY set, bounded by ``connect_timeout_seconds``). The proxy writes a request with
``send``, waits for the status line and headers with ``wait_head`` and then reads the
body as it arrives with ``read`` (each call returns everything received so far, so a
stream passes through chunk by chunk without buffering). Every wait fails with an
`UpstreamError` carrying the reason (a label of ``tpuserve_router_upstream_errors_total``)
and whether anything of the response had arrived, which decides if a retry is safe.

A response is bounded: a head over ``max_head_bytes`` or a body over ``max_body_bytes``
fails with reason ``response_too_large`` (a worker must not be able to fill the router's
memory). A connection goes back to the pool only after a complete response that allows
keep-alive; a cancelled or failed one is closed, which also makes the engine abort the
request.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Awaitable, Callable
from typing import cast

import httptools

from tpuserve_router._native import whole_answer

READ_PAUSE_BYTES = 1 << 20  # stop reading from the worker while this much waits for the client
TIMER_SLACK_SECONDS = 0.002
ALIVE_RECHECK_SECONDS = 0.5
"""How soon a request without a head asks again whether its worker is alive, when no health
probe has ended since it last asked."""
"""How early a check may run and still count as due: the event loop's timers have a
resolution of 1 ms (uvloop's), so one may fire a little before the time it was set for."""


class UpstreamError(Exception):
    """Talking to a worker failed; ``reason`` is the metric label. ``silent``: the worker
    answered neither the request by its floor nor a health probe since it was sent (presumed
    gone, as a refused connection says for certain)."""

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        response_started: bool = False,
        errno: int | None = None,
        silent: bool = False,
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.response_started = response_started
        self.errno = errno  # the OS's error number, when the connection failed with one
        self.silent = silent


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoCallbacks:
    """The protocol of `DETACHED_PARSER`: nothing to call."""


DETACHED_PARSER = httptools.HttpResponseParser(_NoCallbacks())
"""What a closed connection holds instead of its parser."""


class ExtraAnswer(Exception):
    """Raised in the parser when a second answer begins after the one a request asked for."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a worker; one request at a time."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, max_head_bytes: int, max_body_bytes: int
    ) -> None:
        self.loop = loop
        self.max_head_bytes = max_head_bytes
        self.max_body_bytes = max_body_bytes
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # when ``_deadline`` fires
        self._first_byte_at = 0.0
        self._end_at = 0.0
        self._idle_seconds = 0.0
        self._given = 0.0  # first-byte seconds given to the current request
        self._alive_at = math.inf  # when the worker must next show it is alive (no head yet)
        self._alive_every = 0.0
        self._alive: Callable[[], bool | None] | None = None
        self._seen = -1  # body chunks at the last deadline check
        self._paused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_ready = False
        self.chunks: list[bytes] = []
        self.body_chunks = 0  # received, for the stall check
        self.buffered = 0
        self.received = 0  # bytes of the head, then of the body
        self.received_any = False
        self.done = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self._check_at = math.inf  # when the current request's deadlines are next checked
        self._alive = None  # its worker's liveness verdict (`set_deadlines`)
        self._alive_at = math.inf

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        if not self.head_ready:  # count before parsing (server.py says why: quadratic heads)
            seen = self.received + len(data)
            if seen > self.max_head_bytes:
                allowed = max(0, self.max_head_bytes - self.received)
                view = memoryview(data)
                self._feed(view[:allowed])
                if self._head_arrived():
                    self._feed(view[allowed:])
                elif self.error is None:
                    self._too_large()
                return
            self.received = seen
            if seen == len(data):  # an answer's first bytes: the whole of it, maybe
                whole = whole_answer(data, min(self.max_body_bytes, READ_PAUSE_BYTES))
                if whole is not None:
                    self._whole(data, *whole)
                    return
        try:  # as _feed, inlined: this is the request path
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._parse_failed(err)

    def _whole(
        self, data: bytes, status: int, headers: list[tuple[bytes, bytes]], body_at: int
    ) -> None:
        """A whole answer read in one native call (`whole_answer`: HTTP/1.1, a
        content-length, no connection header, nothing past its end), left as the httptools
        callbacks leave one; httptools' parser saw none of it, so it waits for the next."""
        self.status = status
        self.headers = headers
        self.head_ready = True
        body = data[body_at:]
        self.received = len(body)
        if body:
            self.body_chunks = 1
            self.chunks.append(body)
            self.buffered = len(body)
        self.done = True
        self.keep_alive = True
        self._check_at = math.inf  # its timer stays, for the connection's next request
        self._wake()

    def _feed(self, data: bytes | memoryview) -> None:
        if self.closed:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._parse_failed(err)

    def _parse_failed(self, err: httptools.HttpParserError) -> None:
        """The worker sent what is not the answer: invalid HTTP, or bytes past the answer's
        end (`ExtraAnswer`: the answer is kept, its end the last byte relayed, and the
        connection closed, never used again; `Forwarder` counts it against the worker)."""
        detail = f"invalid HTTP from worker: {err}"
        if isinstance(err.__context__, ExtraAnswer):
            detail = "the worker sent bytes past the end of its answer"
        self._fail(
            UpstreamError(
                "reset_before_response" if not self.head_ready else "stream_broken",
                detail,
                response_started=self.head_ready,
            )
        )
        self.close()

    def _head_arrived(self) -> bool:
        return self.head_ready  # a call, so the checker does not assume it unchanged

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_deadline()
        self.parser = DETACHED_PARSER  # it holds our callbacks: a cycle (see server.py)
        if not self.done:
            detail = str(exc) if exc else "connection closed by worker"
            errno = exc.errno if isinstance(exc, OSError) else None
            if self.head_ready:
                self._fail(
                    UpstreamError("stream_broken", detail, response_started=True, errno=errno)
                )
            else:
                self._fail(UpstreamError("reset_before_response", detail, errno=errno))

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        if self.done:  # an answer after the one asked for, even in the same write
            raise ExtraAnswer  # the parse stops here: `_parse_failed`, a broken upstream

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_ready = True
        self.received = 0
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.received += len(body)
        if self.received > self.max_body_bytes:
            self._too_large()
            return
        self.body_chunks += 1
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_PAUSE_BYTES and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.error is not None:  # cut short (too large): the response is not complete
            return
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()
        self._check_at = math.inf  # its timer stays, for the connection's next request
        self._wake()

    # ------------------------------------------------------------------ API for the proxy

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def set_deadlines(
        self,
        first_byte_seconds: float,
        total_seconds: float,
        idle_seconds: float,
        alive: tuple[float, Callable[[], bool | None]] | None = None,
    ) -> None:
        """Fail the pending wait (and close) when the response has not started within
        ``first_byte_seconds`` (reason ``first_byte_timeout``), its body has sent nothing
        for ``idle_seconds`` once that time has passed (``stream_stalled``; detected within
        one to two idle periods, as progress is sampled, not timed per chunk) or it has not
        ended within ``total_seconds`` (``request_timeout``). One timer serves all three, and
        the connection's next requests: it is not cancelled when a response ends, so a request
        on a kept-alive connection usually finds it set for an earlier time and leaves it
        (`_arm`) rather than paying for a timer of its own.

        ``alive``: (seconds, verdict): from ``seconds`` on, while no head has come, the wait
        goes on only while ``verdict()`` says the worker is alive (True: asked again
        ``seconds`` later; None, nothing known yet: asked again in `ALIVE_RECHECK_SECONDS`;
        False: ``first_byte_timeout`` now)."""
        now = self.loop.time()
        if alive is not None and alive[0] < first_byte_seconds:
            self._alive_every, self._alive = alive
            self._alive_at = now + alive[0]
        else:
            self._alive, self._alive_at = None, math.inf
        self._first_byte_at = now + first_byte_seconds
        self._end_at = now + total_seconds
        self._idle_seconds = idle_seconds
        self._given = first_byte_seconds
        self._seen = -1
        self._arm(min(self._first_byte_at, self._alive_at, self._end_at))

    def watch_progress(self) -> None:
        """The body is about to be relayed as it comes (a stream): check its progress from
        now on, every idle period (before, the head's deadline was all that was timed)."""
        if self.done or self.closed:
            return
        self._seen = self.body_chunks
        self._check_again(self.loop.time())

    async def wait_head(self) -> None:
        while not self.head_ready:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self) -> bytes:
        """Body bytes received so far (waiting for some); b"" once the body is complete."""
        while True:
            chunks = self.chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self.buffered = 0
                if self._paused and self.transport:
                    self._paused = False
                    self.transport.resume_reading()
                return data
            if self.done:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read_all(self) -> bytes:
        if self.done:  # the usual case: the whole response came in one read
            data = b"".join(self.chunks)
            self.chunks.clear()
            return data
        parts: list[bytes] = []
        while True:
            data = await self.read()
            if not data:
                return b"".join(parts)
            parts.append(data)

    def header(self, name: bytes) -> bytes | None:
        """The first response header called ``name`` (lower case)."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def close(self) -> None:
        self.closed = True
        self._cancel_deadline()
        if self.transport is not None:
            self.transport.close()

    def abandon(self, error: UpstreamError) -> None:
        """Fail the pending wait with ``error`` and close."""
        if not self.done:
            self._fail(error)
        self.close()

    def prepare(self) -> None:
        """Reset per-response state before reusing the connection."""
        self._reset()
        self.reused = True

    # ------------------------------------------------------------------ internals

    async def _wait(self) -> None:
        waiter = self.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _too_large(self) -> None:
        what = "body" if self.head_ready else "head"
        limit = self.max_body_bytes if self.head_ready else self.max_head_bytes
        self._fail(
            UpstreamError(
                "response_too_large",
                f"the worker's response {what} is over the router's limit of {limit} bytes",
                response_started=self.head_ready,
            )
        )
        self.close()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _check(self) -> None:
        self._deadline = None
        self._timer_at = math.inf
        if self.done or self.closed or self._check_at == math.inf:
            return  # no request, or it has its answer
        now = self.loop.time()
        due = now + TIMER_SLACK_SECONDS  # what may count as come (the timer fires early)
        if due < self._check_at:  # set for an earlier request
            self._arm(self._check_at)
            return
        # Every deadline is compared with the same slack as the timer: ``now + seconds`` is
        # often a hair past the millisecond its timer fires at (uvloop's steps), and a check
        # that took that for "not yet" looked again only an idle period later (issue 57, 8).
        silent = False
        if not self.head_ready and due >= self._first_byte_at:
            reason, detail = "first_byte_timeout", f"no answer within {self._given:.3g} s"
        elif not self.head_ready and due >= self._alive_at and not self._still_alive(now):
            reason, silent = "first_byte_timeout", True
            detail = f"no answer within {self._alive_every:.3g} s, and no health probe passed"
        elif due >= self._end_at:
            reason, detail = "request_timeout", "the request's time is up"
        elif (
            self.head_ready
            and self.body_chunks == self._seen
            and (self.body_chunks or due >= self._first_byte_at)  # the first chunk has its time
            and not self._paused  # paused by us: the client reads slowly, not the worker
        ):
            reason, detail = "stream_stalled", f"nothing for {self._idle_seconds:g} s"
        else:  # in time: sample the body's progress again one idle period on
            self._seen = self.body_chunks if self.head_ready else -1
            self._check_again(now)
            return
        self._fail(UpstreamError(reason, detail, response_started=self.head_ready, silent=silent))
        self.close()

    def _still_alive(self, now: float) -> bool:
        """Ask the worker's liveness verdict (`set_deadlines`' ``alive``); when to ask next."""
        verdict = self._alive() if self._alive is not None else True
        if verdict is False:
            return False
        self._alive_at = now + (self._alive_every if verdict else ALIVE_RECHECK_SECONDS)
        return True

    def _check_again(self, now: float) -> None:
        if not self.head_ready:  # no answer yet: its own deadline, not an idle period on
            next_check = min(self._first_byte_at, self._alive_at)
        else:
            next_check = now + self._idle_seconds
            if not self.body_chunks:
                next_check = max(next_check, self._first_byte_at)
        self._arm(min(self._end_at, next_check))

    def _arm(self, at: float) -> None:
        """Check the deadlines at ``at``: by the timer already set when it fires no later (the
        check then finds it early and sets it again), else by a new one."""
        self._check_at = at
        if self._deadline is not None:
            if self._timer_at <= at:
                return
            self._deadline.cancel()
        self._timer_at = at
        self._deadline = self.loop.call_at(at, self._check)

    def _cancel_deadline(self) -> None:
        self._check_at = math.inf
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
            self._timer_at = math.inf


class UpstreamPool:
    """Idle keep-alive connections to one worker (most recently used first). A ``host``
    that is a path (``/...``: a ``unix:`` worker, `workers.normalize_worker_url`) is dialled
    as that unix socket, with ``host: localhost`` in its requests."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_seconds: float,
        max_idle: int,
        max_head_bytes: int,
        max_body_bytes: int,
        connection: type[UpstreamConnection] = UpstreamConnection,
    ) -> None:
        self.host = host
        self.port = port
        self.connection = connection
        self.unix_path = host if host.startswith("/") else None  # a `unix:` worker's socket
        shown = f"[{host}]" if ":" in host else host
        self.host_header = b"localhost" if self.unix_path else f"{shown}:{port}".encode()
        self.connect_timeout_seconds = connect_timeout_seconds
        self.max_idle = max_idle
        self.max_head_bytes = max_head_bytes
        self.max_body_bytes = max_body_bytes
        self.idle: list[UpstreamConnection] = []
        self.busy: set[UpstreamConnection] = set()  # handed out, not yet released
        self.closed = False

    def take_idle(self) -> UpstreamConnection | None:
        """An idle keep-alive connection, handed out (the caller's to release), if any."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.prepare()
                self.busy.add(conn)
                return conn
        return None

    async def open(
        self, send: Callable[[UpstreamConnection], Awaitable[None]]
    ) -> UpstreamConnection:
        """A connection on which ``send`` (writing a request, waiting for what it needs of the
        answer) succeeded, the caller's to release. A stale pooled connection is replaced
        once by a fresh one (the worker closed it while idle, so it never read the request).
        A connection on which the worker sent anything, even an unreadable head, is not
        stale: the worker read the request, so it is not sent there again."""
        conn = self.take_idle() or await self.connect()
        try:
            await send(conn)
            return conn
        except UpstreamError as err:
            self.release(conn)  # not done: closed
            stale = conn.reused and not conn.received_any
            if err.reason != "reset_before_response" or not stale:
                raise
        except BaseException:
            self.release(conn)
            raise
        conn = await self.connect()
        try:
            await send(conn)
            return conn
        except BaseException:
            self.release(conn)
            raise

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()

        def factory() -> UpstreamConnection:
            return self.connection(loop, self.max_head_bytes, self.max_body_bytes)

        try:
            async with asyncio.timeout(self.connect_timeout_seconds):
                if self.unix_path is not None:
                    _, conn = await loop.create_unix_connection(factory, self.unix_path)
                else:
                    _, conn = await loop.create_connection(factory, self.host, self.port)
        except TimeoutError:
            raise UpstreamError(
                "connect_error", f"connect timed out after {self.connect_timeout_seconds:g} s"
            ) from None
        except OSError as err:
            raise UpstreamError(
                "connect_error", err.strerror or str(err), errno=err.errno
            ) from None
        self.busy.add(conn)
        return conn

    def release(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for reuse if its response is complete, else close it."""
        self.busy.discard(conn)
        if (
            conn.done
            and conn.keep_alive
            and not conn.closed
            and not conn.chunks
            and not self.closed
            and len(self.idle) < self.max_idle
        ):
            self.idle.append(conn)
        else:
            conn.close()

    def fail_unanswered(self, detail: str) -> None:
        """The worker is down: every request on it that has no response head yet fails now
        (reason ``worker_down``), so it is retried elsewhere instead of waiting its time out.
        A response already coming is left alone (the stall timer ends it if it stops): an
        ejection must not kill streams that still produce output."""
        for conn in list(self.busy):
            if not conn.head_ready:
                conn.abandon(UpstreamError("worker_down", detail, response_started=False))

    def close(self) -> None:
        self.closed = True
        for conn in self.idle:
            conn.close()
        self.idle.clear()
