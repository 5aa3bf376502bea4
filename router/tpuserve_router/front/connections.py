"""Client connections as one budget: how many may be open, which one goes under pressure, the
timeouts of connections that hold no request, and the bytes their requests may buffer.

A listener's `ConnectionBook` counts its open connections. At ``max_connections`` a new
connection takes the place of the connection that has waited longest without a request in
hand (idle keep-alive, or a request head or body still arriving): that one is closed, so
thousands of idle or slowloris sockets cannot lock clients out; only when every connection
is busy with a request is the newcomer refused (503, ``Retry-After``, closed).

Every ``tick_seconds`` while connections are open, the book sweeps those that hold no
request and those whose client stopped reading, and closes the ones past their timeout
(each connection knows its own, `Sweepable.expired`). The sweep is a timer re-armed while
connections are open, so a listener nobody stops leaves nothing running once its
connections are gone; `stop` disarms it. Cost on the request path: a dict insert and a dict
delete per request (the book's ordered ``waiting`` set), no timer per request.

What requests buffer is one router-wide budget too (`BufferBudget`, ``--max-buffered-bytes``):
a request body is charged as its bytes arrive (a pipelined one as well) and given back when
its request has been answered (held requests included), so however many clients send large
bodies at once, the router holds at most the budget of them. A request whose declared length
does not fit in what is left, or whose body runs past it, is answered 503 with
``Retry-After`` and its connection closed (`server.HttpConnection`). Each client (an API key's
tenant, or without keys an address) may hold at most a share of it
(``--max-buffered-bytes-per-client``), so no one client can lock the others out; the endpoint
picker's bodies are charged to the same budget, as no client's (its one client is the gateway).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Protocol

MIN_TICK_SECONDS = 0.01
MAX_TICK_SECONDS = 1.0


class Sweepable(Protocol):
    """What the book needs of a connection (`server.HttpConnection`)."""

    def expired(self, now: float) -> str | None:
        """Close the connection if one of its timeouts passed; the reason, else None."""

    def evict(self) -> None:
        """Close the connection to make room for another."""


class BufferBudget:
    """The bytes of request bodies the router holds at once, at most ``max_bytes``, and of
    them at most ``max_client_bytes`` for any one client (a key naming it; None: charged to
    no client, bounded by the whole budget alone)."""

    __slots__ = ("by_client", "max_bytes", "max_client_bytes", "used")

    def __init__(self, max_bytes: int, max_client_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_client_bytes = max_bytes if max_client_bytes is None else max_client_bytes
        self.used = 0
        self.by_client: dict[str, int] = {}
        """What each client holding bytes holds (clients at 0 are dropped)."""

    @property
    def free(self) -> int:
        return self.max_bytes - self.used

    def free_for(self, client: str | None) -> int:
        """What ``client`` may still take: the budget's rest, or less, its share's rest."""
        free = self.max_bytes - self.used
        if client is None:
            return free
        return min(free, self.max_client_bytes - self.by_client.get(client, 0))

    def take(self, size: int, client: str | None = None) -> bool:
        """Charge ``size`` bytes (to ``client``) if they fit; False (nothing charged) if not."""
        if self.used + size > self.max_bytes:
            return False
        if client is not None:
            held = self.by_client.get(client, 0) + size
            if held > self.max_client_bytes:
                return False
            self.by_client[client] = held
        self.used += size
        return True

    def give(self, size: int, client: str | None = None) -> None:
        self.used -= size
        if client is not None and size:
            held = self.by_client.get(client, 0) - size
            if held > 0:
                self.by_client[client] = held
            else:
                self.by_client.pop(client, None)


UNBOUNDED: Final = 1 << 62
"""The budget of a book given none (a test's listener, say): in practice, no bound."""


class ConnectionBook:
    """The open connections of one listener, their budget and their timeouts."""

    def __init__(
        self,
        max_connections: int,
        tick_seconds: float,
        count: Callable[[str], None] | None = None,
        buffers: BufferBudget | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.buffers = buffers if buffers is not None else BufferBudget(UNBOUNDED)
        self.tick_seconds = min(MAX_TICK_SECONDS, max(MIN_TICK_SECONDS, tick_seconds))
        self.count = count or (lambda reason: None)
        self.open: set[Sweepable] = set()
        # Connections without a request in hand, longest waiting first (dicts keep order).
        self.waiting: dict[Sweepable, None] = {}
        self.stalled: set[Sweepable] = set()  # busy, but the client stopped reading
        self.now = 0.0  # the sweep's clock (loop time), read by connections for their phases
        self._timer: asyncio.TimerHandle | None = None

    def stop(self) -> None:
        """Stop sweeping (the owner closes the connections)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ a connection's life

    def opened(self, conn: Sweepable) -> bool:
        """Admit a new connection, closing the longest-waiting one if the budget is spent;
        False if every open connection is busy (the caller refuses the newcomer)."""
        if len(self.open) >= self.max_connections:
            victim = next(iter(self.waiting), None)
            if victim is None:
                self.count("refused")
                return False
            self.closed(victim)
            victim.evict()
            self.count("evicted")
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self.now = loop.time()
            self._timer = loop.call_later(self.tick_seconds, self._tick, loop)
        self.open.add(conn)
        self.waiting[conn] = None
        return True

    def closed(self, conn: Sweepable) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)
        self.stalled.discard(conn)

    def busy(self, conn: Sweepable) -> None:
        """``conn`` has a request in hand: neither evictable nor subject to read timeouts."""
        self.waiting.pop(conn, None)

    def idle(self, conn: Sweepable) -> None:
        """``conn`` finished its requests and waits for the next (it goes to the back)."""
        self.waiting[conn] = None

    # ------------------------------------------------------------------ timeouts

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.sweep(loop.time())
        self._timer = loop.call_later(self.tick_seconds, self._tick, loop) if self.open else None

    def sweep(self, now: float) -> None:
        """Close every connection past one of its timeouts."""
        self.now = now
        for conn in [*self.waiting, *self.stalled]:
            reason = conn.expired(now)
            if reason is not None:
                self.closed(conn)
                self.count(reason)
