"""Router replicas' shared view: what a replica tells its peers, and what it does with theirs.

Each replica announces every routing decision it acts on, its first byte and its end
(`PeerLink`); each replica applies its peers' announcements as if it had routed the requests
itself (`PeerView`): the request counts in flight on its worker (`load_view`'s
``announced_in_flight``), and a `BlockIndex` policy predicts its blocks and books its uncached
prompt tokens (``apply_peer_route``), released at its first byte or end. So the replicas share
one view, a millisecond or so old, instead of each seeing only what it sent.

The wire: one msgpack array per message, ``[FORMAT, kind, router id, request number, ...]``:

- ``route``: ``..., worker, booked prefill tokens, last block key or None, block keys`` (the
  keys as one binary string of little-endian signed 64-bit integers, at most `MAX_ROUTE_KEYS`:
  a longer prompt's leading blocks);
- ``first_byte`` (prefill over: release the booking) and ``end`` (in flight -1);
- ``hello``: sent every `HELLO_SECONDS`, so a silent peer is told from an idle one; its
  request number is the sender's oldest open request (or the next number when none is open):
  every entry of that peer below it has ended, so one whose ``end`` was lost (ZMQ drops
  messages past the high-water mark, or while a connection is down) is dropped at the next
  hello.

Everything is bounded: a message over `MAX_MESSAGE_BYTES` is refused; a peer keeps at most
``max_open_per_peer`` open requests here (its oldest dropped first), each for at most
``open_ttl_seconds`` (the longest a request may run), and only until the peer's next hello
says it has ended (a lost ``end``); a peer that disconnects (`peers`) or is
silent for `SILENT_SECONDS` has all its entries dropped. A message this replica cannot read
raises `PeerMessageError` (the caller counts and skips it). The router id is per process, so
a replica ignores its own messages (a peer list that includes itself is harmless).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgpack

from tpuserve_router.engines.load_view import PeerLoad, announce_peer_request
from tpuserve_router.labels import PEER_KINDS, PEER_MESSAGE_KINDS, PeerKind
from tpuserve_router.policies.base import Decision, Policy

FORMAT: Final = 1
"""The wire format's version: a replica reads only messages of its own format."""
MAX_ROUTE_KEYS: Final = 1 << 15
"""Block keys a route message carries at most (512 Ki tokens at 16 per block)."""
MAX_MESSAGE_BYTES: Final = 1 << 20
HELLO_SECONDS: Final = 1.0
SILENT_SECONDS: Final = 5.0
"""A peer heard nothing from this long (no hello) is taken for gone: its entries drop."""

Kind = PeerKind
KINDS: Final = PEER_KINDS
MESSAGE_KINDS: Final = PEER_MESSAGE_KINDS


class PeerMessageError(ValueError):
    """A peer's message this replica cannot use; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class PeerMessage:
    kind: Kind
    router: str
    request: int = 0
    worker: str = ""
    booked_tokens: int = 0
    last_key: int | None = None
    keys: Sequence[int] = ()


def new_router_id() -> str:
    """This process's id on the wire: host, pid and a random part (a restart is a new peer)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


def _pack_keys(keys: Sequence[int]) -> bytes:
    packed = array("q", keys[:MAX_ROUTE_KEYS])
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack_keys(raw: bytes) -> array[int]:
    if len(raw) % 8:
        raise PeerMessageError(f"keys: {len(raw)} bytes is not a whole number of 64-bit keys")
    keys = array("q")
    keys.frombytes(raw)
    if sys.byteorder == "big":
        keys.byteswap()
    return keys


def encode(message: PeerMessage) -> bytes:
    head: list[Any] = [FORMAT, message.kind, message.router, message.request]
    if message.kind == "route":
        head += [
            message.worker, message.booked_tokens, message.last_key, _pack_keys(message.keys)
        ]  # fmt: skip
    packed: bytes = msgpack.packb(head)
    return packed


def decode(raw: bytes) -> PeerMessage:
    """A peer's message; raises `PeerMessageError` naming what is wrong."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise PeerMessageError(f"{len(raw)} bytes; allowed: at most {MAX_MESSAGE_BYTES}")
    try:
        items = msgpack.unpackb(raw, raw=False, use_list=True)
    except (ValueError, msgpack.UnpackException) as err:  # ExtraData is a ValueError
        raise PeerMessageError(f"not msgpack: {err}") from None
    if not isinstance(items, list) or len(items) < 4:
        raise PeerMessageError("expected an array [format, kind, router, request, ...]")
    version, kind, router, request = items[:4]
    if version != FORMAT:
        raise PeerMessageError(f"format {version!r}; allowed: {FORMAT}")
    if kind not in KINDS:
        raise PeerMessageError(f"kind {kind!r}; allowed: {', '.join(KINDS)}")
    if not isinstance(router, str) or not router:
        raise PeerMessageError(f"router {router!r}: expected a non-empty string")
    if not _is_int(request):
        raise PeerMessageError(f"request {request!r}: expected an integer")
    if kind != "route":
        return PeerMessage(kind, router, request)
    if len(items) != 8:
        raise PeerMessageError(f"route: {len(items)} fields; expected 8")
    worker, booked, last_key, keys = items[4:]
    if not isinstance(worker, str) or not worker:
        raise PeerMessageError(f"route worker {worker!r}: expected a non-empty string")
    if not _is_int(booked) or booked < 0:
        raise PeerMessageError(f"route booked tokens {booked!r}: expected an integer >= 0")
    if last_key is not None and not (_is_int(last_key) and -(1 << 63) <= last_key < 1 << 63):
        raise PeerMessageError(f"route last key {last_key!r}: expected a 64-bit integer or nil")
    if not isinstance(keys, bytes):
        raise PeerMessageError("route keys: expected binary")
    return PeerMessage(kind, router, request, worker, booked, last_key, _unpack_keys(keys))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PeerWorker(PeerLoad, Protocol):
    """A worker as peering needs it: its name and its load view."""

    @property
    def name(self) -> str: ...


class PeerLink:
    """What this replica tells its peers about the decisions it acts on.

    ``send`` delivers a message to every peer (the router's PUB socket, or the benchmark's
    delayed delivery). A caller calls `routed` once per decision it acts on, `prefill_done`
    at its first byte (optional) and `ended` exactly once, as it calls the policy's hooks.
    """

    def __init__(self, router: str, send: Callable[[PeerMessage], None]) -> None:
        self.router = router
        self.send = send
        self._next = 0
        self._open: dict[int, int] = {}  # id(decision) -> its request number

    def routed(self, decision: Decision[Any]) -> None:
        self._next += 1
        self._open[id(decision)] = self._next
        keys = decision.block_keys
        self.send(
            PeerMessage(
                "route", self.router, self._next, decision.worker.name,
                decision.pending_units, keys[-1] if keys else None, keys,
            )
        )  # fmt: skip

    def prefill_done(self, decision: Decision[Any]) -> None:
        request = self._open.get(id(decision))
        if request is not None:
            self.send(PeerMessage("first_byte", self.router, request))

    def ended(self, decision: Decision[Any]) -> None:
        request = self._open.pop(id(decision), None)
        if request is not None:
            self.send(PeerMessage("end", self.router, request))

    def hello(self) -> None:
        """Say this replica is alive, and which of its requests are still open: the hello's
        request number is its oldest open one (``_open`` keeps the order they were routed in),
        or the next number when none is."""
        oldest = next(iter(self._open.values()), self._next + 1)
        self.send(PeerMessage("hello", self.router, oldest))

    @property
    def open_requests(self) -> int:
        return len(self._open)


@dataclass(slots=True)
class _Open:
    """A peer's request in flight, as applied here."""

    decision: Decision[Any]
    expires_at: float
    prefilled: bool = False


@dataclass(slots=True)
class _Peer:
    heard_at: float
    requests: OrderedDict[int, _Open] = field(default_factory=OrderedDict)


class PeerView:
    """This replica's copy of its peers' open requests, applied to its load view and policy.

    ``worker_named(name)`` finds the replica's own view of a worker (None: not one of its
    workers, and the announcement is ignored). ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        router: str,
        policy: Policy,
        worker_named: Callable[[str], PeerWorker | None],
        *,
        clock: Callable[[], float],
        max_open_per_peer: int,
        open_ttl_seconds: float,
        silent_seconds: float = SILENT_SECONDS,
    ) -> None:
        self.router = router
        self.policy = policy
        self.worker_named = worker_named
        self.clock = clock
        self.max_open_per_peer = max_open_per_peer
        self.open_ttl_seconds = open_ttl_seconds
        self.silent_seconds = silent_seconds
        self.peers: dict[str, _Peer] = {}
        self._next_expiry = math.inf

    def apply(self, message: PeerMessage) -> bool:
        """Take one peer message; False if it was this replica's own."""
        if message.router == self.router:
            return False
        now = self.clock()
        peer = self.peers.get(message.router)
        if peer is None:
            peer = self.peers[message.router] = _Peer(now)
        peer.heard_at = now
        kind = message.kind
        if kind == "route":
            self._route(peer, message, now)
        elif kind == "first_byte":
            entry = peer.requests.get(message.request)
            if entry is not None and not entry.prefilled:
                entry.prefilled = True
                self.policy.on_prefill_done(entry.decision)
        elif kind == "end":
            entry = peer.requests.pop(message.request, None)
            if entry is not None:
                self._close(entry)
        elif kind == "hello":
            self._drop_ended(peer, message.request)
        return True

    def _drop_ended(self, peer: _Peer, oldest_open: int) -> None:
        """The peer's requests numbered below its oldest open one have ended there: drop
        any still open here (their ``end`` was lost). Entries are in the order routed."""
        requests = peer.requests
        while requests:
            number, entry = next(iter(requests.items()))
            if number >= oldest_open:
                return
            del requests[number]
            self._close(entry)

    def _route(self, peer: _Peer, message: PeerMessage, now: float) -> None:
        worker = self.worker_named(message.worker)
        if worker is None or message.request in peer.requests:
            return
        decision: Decision[Any] = Decision(worker, "load_only", pending_units=message.booked_tokens)
        self.policy.apply_peer_route(decision, message.last_key, message.keys)
        announce_peer_request(worker, +1)
        expires_at = now + self.open_ttl_seconds
        peer.requests[message.request] = _Open(decision, expires_at)
        self._next_expiry = min(self._next_expiry, expires_at)
        while len(peer.requests) > self.max_open_per_peer:
            _, oldest = peer.requests.popitem(last=False)
            self._close(oldest)

    def _close(self, entry: _Open) -> None:
        announce_peer_request(entry.decision.worker, -1)
        self.policy.on_request_done(entry.decision, True)

    def drop(self, router: str) -> int:
        """Forget a peer (it disconnected or went silent): all its requests end here.
        Returns how many were open."""
        peer = self.peers.pop(router, None)
        if peer is None:
            return 0
        for entry in peer.requests.values():
            self._close(entry)
        return len(peer.requests)

    def expire(self) -> list[tuple[str, int]]:
        """Drop silent peers and requests open past their time to live; returns the peers
        dropped as silent and how many requests each had open."""
        now = self.clock()
        silent = [
            router
            for router, peer in self.peers.items()
            if now - peer.heard_at > self.silent_seconds
        ]
        dropped = [(router, self.drop(router)) for router in silent]
        if now >= self._next_expiry:
            next_expiry = math.inf
            for peer in self.peers.values():
                requests = peer.requests
                while requests:
                    number, entry = next(iter(requests.items()))
                    if entry.expires_at > now:
                        next_expiry = min(next_expiry, entry.expires_at)
                        break
                    del requests[number]
                    self._close(entry)
            self._next_expiry = next_expiry
        return dropped

    def open_requests(self, router: str | None = None) -> int:
        """Peers' requests open here: one peer's, or all."""
        if router is not None:
            peer = self.peers.get(router)
            return len(peer.requests) if peer is not None else 0
        return sum(len(peer.requests) for peer in self.peers.values())
