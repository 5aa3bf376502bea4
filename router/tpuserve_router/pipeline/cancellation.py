"""Stopping work nobody waits for: SGLang's ``/abort_request`` for a request the router gave up.

A worker keeps generating for a client that left: SGLang notices a closed connection of a
non-streamed request only every few seconds (``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, 4 s),
and a request still queued holds its KV-cache reservation meanwhile. So when the router
abandons a request a worker still holds (the client disconnected or stopped reading, or the
worker timed out, stalled or answered too much), it asks that worker to abort it by its
request id, ``POST /abort_request {"rid": ...}``, in the background.

The id is the router's own for that request (`tpuserve_router.pipeline.request_ids`), never the
client's: SGLang aborts every request whose id starts with the one given, and the router's ids
(32 random hex digits each) are never prefixes of one another. Only a request that is one
generation (one prompt, ``n`` = 1) is aborted by the router: a batch or a request with several
samples is left to SGLang's own disconnect check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
import orjson

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.engines.worker_session import WorkerSession
from tpuserve_router.labels import ABORT_REASONS as ABORT_REASONS

log = logging.getLogger(__name__)


class Aborter:
    """Sends the aborts, in background tasks it owns (`stop` cancels them)."""

    def __init__(
        self,
        session: Callable[[], WorkerSession | None],
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
