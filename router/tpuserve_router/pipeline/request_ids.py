"""What names a request on a worker: an id of the router's own, never the client's.

SGLang 0.5.23 aborts by prefix: ``/abort_request {"rid": R}``, when R is the id of a live
request, stops every request whose id *starts with* R (its scheduler's
``req.rid.startswith(recv_req.rid)``). A client whose ``rid`` reached the engine could name its
own request with a prefix of other clients' ids, leave, and have the router's abort of its
request stop theirs too; a ``""`` or ``null`` rid made the router's own abort miss. So every
generation request the router forwards carries an id of the router's, `new_rid`: 32 random hex
digits (`os.urandom`, read 4 KiB at a time), drawn per request, with no shared prefix and no
counter. Ids of one width
that differ are never prefixes of one another, so an abort by one stops that request alone.

- A client's ``rid`` that is a string (``""`` included), or none, is replaced by one id: a
  single generation is then named by it exactly (the router aborts by it); a batch's items are
  named ``ID_0``, ``ID_1``, ... by SGLang and several samples (``n`` > 1) get ids of SGLang's
  own, and neither is aborted by the router (SGLang's own disconnect check stops them).
- A list of rids (one per prompt of a batch) is replaced by a list of fresh ids, as long.
- Anything else is refused (400 naming ``rid``), as SGLang refuses it.

The client's own id is kept for its answer only: where SGLang echoes it (a response's ``id``,
``meta_info.id``, a batch item's ``RID_i``), `Restorer` writes it back in place of the
router's, in whole answers and in streams (an id split across two reads is held until the
next one). A router id is 32 random digits the client never saw before its answer, so it
stands in an answer only where the engine echoes it. A client that gave no id sees the
router's, as it would see one SGLang drew.

A body without a ``rid`` member gets the id inserted at its front, the rest forwarded byte for
byte; a body with one is written again with orjson (integers past 64 bits, which orjson reads
as floats, would change: SGLang has no such field).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tpuserve_router.pipeline.request_body import ClientError

RID_HEX_DIGITS: Final = 32
_QUOTED_WIDTH: Final = 1 + RID_HEX_DIGITS  # '"' and the id: how a router id starts in JSON


_RID_BYTES: Final = RID_HEX_DIGITS // 2
_POOL_BYTES: Final = 4096  # 256 ids a read of the kernel's generator, not one read each
_pool = memoryview(b"")


def new_rid() -> str:
    """A request id of the router's: 32 random hex digits (128 bits), as SGLang's own look;
    from the operating system's generator (as `secrets`), each byte used once."""
    global _pool
    if len(_pool) < _RID_BYTES:
        _pool = memoryview(os.urandom(_POOL_BYTES))
    drawn, _pool = _pool[:_RID_BYTES], _pool[_RID_BYTES:]
    return drawn.hex()


def _forget_pool() -> None:
    """A forked child draws its own bytes, never its parent's ids again."""
    global _pool
    _pool = memoryview(b"")


os.register_at_fork(after_in_child=_forget_pool)


def with_rid(body: bytes, rid: str) -> bytes:
    """``body`` (a JSON object without a ``rid``) with ``"rid": rid`` as its first member."""
    start = body.index(b"{") + 1  # a parsed JSON object: there is one, after any whitespace
    return b'{"rid":"' + rid.encode() + b'",' + body[start:]


class Restorer:
    """Writes a client's own ids back into its answer in place of the router's."""

    __slots__ = ("_held", "_pairs")

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        """``pairs``: (the router's id, the client's id it stands for)."""
        # '"ID' becomes '"CLIENT' (JSON-escaped, unclosed): "ID" -> "CLIENT", "ID_0" -> "CLIENT_0"
        self._pairs = [(b'"' + ours.encode(), orjson.dumps(theirs)[:-1]) for ours, theirs in pairs]
        self._held = b""

    def whole(self, body: bytes) -> bytes:
        """A whole answer with the client's ids back."""
        for ours, theirs in self._pairs:
            body = body.replace(ours, theirs)
        return body

    def chunk(self, data: bytes) -> bytes:
        """The next piece of a stream with the client's ids back; a piece that may end inside
        a router id is held back until the next piece (or `rest`)."""
        if self._held:
            data, self._held = self._held + data, b""
        # A router id is '"' and hex digits: only the last quote can start one cut short.
        cut = data.rfind(b'"', max(0, len(data) - _QUOTED_WIDTH + 1))
        if cut >= 0:
            tail = data[cut:]
            if any(ours.startswith(tail) for ours, _ in self._pairs):
                self._held, data = tail, data[:cut]
        return self.whole(data)

    def rest(self) -> bytes:
        """What is held back when the stream ends: it was no router id, so as it came."""
        held, self._held = self._held, b""
        return held


@dataclass(frozen=True, slots=True)
class ClientRid:
    """The ``rid`` a client gave, checked."""

    given: bool
    """The body has a ``rid`` member (``null`` included)."""
    value: str | list[str] | None


NO_RID: Final = ClientRid(False, None)


def client_rid(data: Mapping[str, Any]) -> ClientRid:
    """The client's ``rid`` in a parsed body; ClientError (400) for one SGLang refuses."""
    if "rid" not in data:
        return NO_RID
    value = data["rid"]
    if value is None or isinstance(value, str):
        return ClientRid(True, value)
    if isinstance(value, list) and all(isinstance(r, str) for r in value):
        return ClientRid(True, value)
    raise ClientError(
        400,
        f"rid: {orjson.dumps(value).decode()[:80]} is not allowed; allowed: a string, a list "
        "of strings (one per prompt of a batch) or null",
        param="rid",
    )


@dataclass(frozen=True, slots=True)
class EngineIds:
    """How a request is named on the worker."""

    body: bytes
    """The body to forward, with the router's id(s) as its ``rid``."""
    rid: str | None
    """The id that names the request alone on the worker, to abort it (None: a batch, or
    several samples, which the router does not abort)."""
    restorer: Restorer | None
    """Writes the client's own ids back into the answer (None: the client gave none)."""


def name_request(body: bytes, theirs: ClientRid, single: bool) -> EngineIds:
    """Name a generation request (``body``, whose rid is ``theirs``) on the engine;
    ``single``: it is one generation (one prompt, ``n`` = 1), named by its rid alone."""
    value = theirs.value
    if isinstance(value, list):
        fresh = [new_rid() for _ in value]
        ours: str | list[str] = fresh
        pairs, abortable = list(zip(fresh, value, strict=True)), None
    else:
        ours = rid = new_rid()
        pairs = [] if value is None else [(rid, value)]
        abortable = rid if single else None
    if theirs.given:  # read again (not kept while the request waited), written with ours
        named = orjson.dumps({**orjson.loads(body), "rid": ours})
    else:
        assert isinstance(ours, str)
        named = with_rid(body, ours)
    return EngineIds(named, abortable, Restorer(pairs) if pairs else None)
