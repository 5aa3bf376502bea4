"""Stopping work nobody waits for: SGLang's ``/abort_request`` for a request the router gave up.

A worker keeps generating for a client that left: SGLang notices a closed connection of a
non-streamed request only every few seconds (``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, 4 s),
and a request still queued holds its KV-cache reservation meanwhile. So when the router
abandons a request a worker still holds (the client disconnected or stopped reading, or the
worker timed out, stalled or answered too much), it asks that worker to abort it by its
request id, ``POST /abort_request {"rid": ...}``, in the background.

The id is the client's ``rid`` when it gave one; otherwise the router gives every request
that is one generation (one prompt, ``n`` = 1: SGLang then keeps the id as it is) an id of
its own, `new_rid`, inserted at the front of the JSON body it forwards (`with_rid`). A batch
or a request with several samples is left to SGLang's own disconnect check.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable
from typing import Final

import aiohttp
import orjson

from sglang_tpu.tasks import cancel_and_wait

log = logging.getLogger(__name__)

ABORT_REASONS: Final = ("client_gone", "gave_up")
"""Why the router aborted a request: its client left, or the router stopped waiting."""

_PREFIX: Final = os.urandom(8).hex()  # this router's; the counter keeps its ids apart
_COUNTER = itertools.count()


def new_rid() -> str:
    """A request id unique across routers, shaped as SGLang's own (32 hex digits)."""
    return f"{_PREFIX}{next(_COUNTER):016x}"


def with_rid(body: bytes, rid: str) -> bytes:
    """``body`` (a JSON object without a ``rid``) with ``"rid": rid`` as its first member."""
    start = body.index(b"{") + 1  # a parsed JSON object: there is one, after any whitespace
    return b'{"rid":"' + rid.encode() + b'",' + body[start:]


class Aborter:
    """Sends the aborts, in background tasks it owns (`stop` cancels them)."""

    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession | None],
        count: Callable[[str, str], None] = lambda worker, reason: None,
    ) -> None:
        self.session = session
        self.count = count
        self._tasks: set[asyncio.Task[None]] = set()

    def abort(self, worker: str, rid: str, reason: str) -> None:
        """Ask ``worker`` (its URL) to abort ``rid``; ``reason`` is one of `ABORT_REASONS`."""
        self.count(worker, reason)
        task = asyncio.get_running_loop().create_task(self._send(worker, rid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, worker: str, rid: str) -> None:
        session = self.session()
        if session is None:
            return
        try:
            async with session.post(
                worker + "/abort_request",
                data=orjson.dumps({"rid": rid}),
                headers={"content-type": "application/json"},
            ) as response:
                await response.read()
                if response.status != 200:
                    log.info("worker %s refused to abort %s: %s", worker, rid, response.status)
        except (aiohttp.ClientError, OSError) as err:
            log.info("could not ask worker %s to abort %s: %s", worker, rid, err)

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
