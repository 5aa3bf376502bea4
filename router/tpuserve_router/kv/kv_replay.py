"""Ask an engine's KV-event replay socket for its buffered batches, one round at a time.

SGLang sends a replay from a ROUTER socket in one loop (its buffer holds 10,000 batches), and a
ROUTER drops whatever its send queue (1,000 messages) cannot take while its I/O thread writes,
the end marker too; on a loaded machine most replays of a full buffer lose part of it, and
asking again for the whole buffer loses part again. What does arrive arrives in order, and the
first batches of every answer always arrive (the queue is empty when the engine starts
sending). So a replay is read in rounds (`read_round`): the caller applies the run without a
hole that a round brings (`leading_run`) and asks again from the first batch it lacks; every
round brings at least one batch the caller did not have, and usually a queue's worth, so a
late router catches up whole however busy it is, in a bounded number of rounds
(`REPLAY_MAX_ROUNDS`). `tpuserve_router.kv.kv_events` decides what a round's batches mean for
the index.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import zmq
import zmq.asyncio

from sglang_tpu.kv_events import END_SEQ, KVEventDecodeError, parse_replay_reply, replay_request

__all__ = ["ReplayRound", "leading_run", "read_round"]

log = logging.getLogger(__name__)

REPLAY_TIMEOUT_SECONDS = 2.0
"""Longest wait for the next message of a replay."""
REPLAY_QUEUE_BATCHES = 100_000
"""Batches a replay socket queues unread: past SGLang's buffer (10,000 batches by default), so
libzmq's I/O thread takes the replay off the engine's hands as fast as the engine's own send
queue empties, while a busy event loop reads it."""
REPLAY_MAX_BATCHES = 1_000_000
"""Batches one round may bring at most (a publisher that never ends its replay fails it)."""
REPLAY_MAX_ROUNDS = 64
"""Rounds one catch-up asks for at most. Each brings at least one new batch and usually the
engine's whole send queue (1,000): a full SGLang buffer takes about ten when every round loses
its tail, and a publisher that keeps answering with less is given up on (and asked again at
its next batch)."""
DRAIN_MAX_MESSAGES = 64
"""Messages read per wake-up of the event loop, from a replay round or a live stream
(`tpuserve_router.kv.kv_events` reads by it too), bounded so requests keep flowing (the rest
are read on the loop's next turn)."""


@dataclass(frozen=True, slots=True)
class ReplayRound:
    """What one replay request brought: batches at or after its start (and before its end, if
    it had one), in order, and whether the end marker came (else the answer went silent)."""

    batches: list[tuple[int, bytes]]
    ended: bool


async def read_round(
    context: zmq.asyncio.Context, endpoint: str, start: int, end: int | None = None
) -> ReplayRound | None:
    """Ask ``endpoint`` for the batches from ``start`` and read its answer: None when it did not
    answer at all (nothing within `REPLAY_TIMEOUT_SECONDS`, a socket error, a malformed reply,
    or more than `REPLAY_MAX_BATCHES`). Batches at or past ``end`` are left out."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, REPLAY_QUEUE_BATCHES)
    drain: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)  # no futures per message
    found: dict[int, bytes] = {}
    received = 0
    try:
        sock.connect(endpoint)
        await sock.send_multipart(replay_request(start))
        while True:
            if not await sock.poll(int(REPLAY_TIMEOUT_SECONDS * 1000)):
                if found:
                    return ReplayRound(sorted(found.items()), ended=False)
                log.warning("replay from %s timed out", endpoint)
                return None
            for _ in range(DRAIN_MAX_MESSAGES):
                try:
                    frames = drain.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                seq, payload = parse_replay_reply(frames)
                if seq == END_SEQ:
                    return ReplayRound(sorted(found.items()), ended=True)
                received += 1
                if received > REPLAY_MAX_BATCHES:
                    log.warning("replay from %s: more than %d batches", endpoint, received - 1)
                    return None
                if seq >= start and (end is None or seq < end):
                    found[seq] = payload
            await asyncio.sleep(0)  # requests go on between chunks of a long replay
    except (zmq.ZMQError, KVEventDecodeError) as err:
        log.warning("replay from %s failed: %s", endpoint, err)
        return None
    finally:
        sock.close(linger=0)


def leading_run(batches: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """The batches, in order, up to the first hole in their numbers."""
    for i in range(1, len(batches)):
        if batches[i][0] != batches[i - 1][0] + 1:
            return batches[:i]
    return batches
