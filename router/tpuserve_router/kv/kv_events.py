"""Subscribe to every worker's KV-cache events and keep the block index in step with them.

Per stream, a reader takes what is queued (a ``tcp://`` stream is read by `zmtp.ZmtpSubscriber`
on the event loop, without libzmq's I/O thread; any other by a ZMQ SUB socket) and applies each
batch to the policy's `BlockIndex` without awaiting (frames and payload decoded by
`sglang_tpu.kv_events`, the one schema module, in either SGLang wire generation; the usual
batch, only well-formed ``BlockStored`` and ``BlockRemoved`` events, is read and applied in
compiled code, `BlockIndex.apply_batch`, and any other goes through that module; on a
``tcp://`` stream a run of such batches in sequence is applied by the compiled reader where
it split the frames, `ZmtpReader.apply_in_order`, with no Python per batch); only a batch
out of sequence waits, for the replay below. A worker publishes one stream, or one per
data-parallel rank (`tpuserve_router.kv.kv_publishers` finds them); each stream is indexed as
that worker's rank and everything below happens per stream. Sequence numbers decide what
the index can still trust:

- the next number: apply;
- a jump forward (batches lost, ZMQ drops past its high-water mark): ask the engine's
  replay socket for the missing ones, in rounds that each apply the run up to their first
  hole and ask again from the first batch still missing (`tpuserve_router.kv.kv_replay`); if it
  cannot give all of them, *resync*: drop everything known about that worker and carry on
  from the current batch;
- a jump back (the engine restarted and numbers from 0 again): drop everything, then
  replay the new engine's batches before this one;
- the connection to the publisher dropped (seen by the ZMTP reader, or on a libzmq socket's
  monitor): drop everything at once (the engine is gone, or restarting with an empty cache);
  on every (re)connect, rebuild from the engine's replay buffer from 0, so a router that
  subscribes late still learns the resident prefixes (sglang#39750) and a restarted idle
  engine is known empty, and a second later look again for a batch published before the
  publisher took the subscription into account;
- the first batch seen with a number above 0 and no catch-up yet: replay from 0.

A replica started after an engine's replay buffer wrapped starts a stream from a peer
router's snapshot instead (`tpuserve_router.peering.kv_snapshot`: the hub asks it where each new
stream starts) and replays only from the snapshot's batch number; a seeded stream whose engine
no longer holds the snapshot's last batch nor any later one (it restarted meanwhile) drops the
snapshot's blocks (``engine_restart``) and is replayed from 0.

``AllBlocksCleared`` (the engine's cache was flushed) drops everything that stream held.
Each of these is counted in the ``tpuserve_router_kv_event_*`` series. A message or event
the router cannot use (bad frames, an undecodable batch, a malformed or unknown event) is
skipped, counted in ``tpuserve_router_kv_events_skipped_total{reason}`` and logged once per
worker and reason; the rest of its batch is still applied and the subscriber carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from sglang_tpu.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    decode_batch,
    parse_pub_frames,
)
from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.kv.kv_publishers import Endpoints
from tpuserve_router.kv.kv_replay import (
    DRAIN_MAX_MESSAGES,
    REPLAY_MAX_ROUNDS,
    leading_run,
    read_round,
)
from tpuserve_router.kv.zmq_monitor import stop_monitor
from tpuserve_router.kv.zmtp import SubscriberGroup, ZmtpSubscriber, tcp_address
from tpuserve_router.metrics import RouterMetrics

__all__ = ["Endpoints", "KvEventHub"]

log = logging.getLogger(__name__)

CATCH_UP_RETRY_SECONDS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
"""Waits before asking again after a catch-up that did not reach the end of the engine's
buffer (its replay socket did not answer, or stopped answering before the rounds were done):
an idle engine sends no batch whose number would show what the index lacks."""
CONFIRM_AFTER_CONNECT_SECONDS = 1.0
"""A second catch-up this long after each (re)connect's first: a publisher takes a new
subscription into account a moment after the handshake, and a batch it published in between
reached neither that first replay (it came before) nor this stream (it was not subscribed yet);
an idle engine would send no later batch whose sequence number showed the gap."""
READ_INTERVAL_SECONDS = 0.030
"""A busy ``tcp://`` stream is read at most this often, every such stream in one wake-up of
the event loop (`zmtp.SubscriberGroup`): events arrive at most this late, and under load
cost a read per turn rather than a wake-up per batch, and a turn applies more batches while
their code is in the caches. With four busy engines, 10 ms cost ~10 % less CPU per request
than 5 ms (CHANGELOG.md, router CPU pass 6), and 20 ms 7 % less than 10 ms (paired, both
routers at once: pass 13), and 30 ms 5 % less than 20 ms (pass 16:
a turn costs about twice the time it takes, the request path's caches refilled after it).
With the delay modelled (`tpuserve bench --kv-event-interval`), 30 ms changed no decision of
`precise` against 20 ms on W1, W2 and W6 (2,400 requests), nor any result on W1-W6, W9 and
W10 (3 seeds, but W6 seed 1: hit rate 0.7865 -> 0.7903) or with 2 and 4 peering replicas;
40 ms began to cost (W1: 38 decisions changed, hit rate 0.9342 -> 0.9333, p99 TTFT 0.067 ->
0.080 s), so not further."""
READ_BACKSTOP_SECONDS = 0.100
"""The turn is taken before a routing decision once `READ_INTERVAL_SECONDS` have passed
(`zmtp.SubscriberGroup.read_if_due`), in a wake-up the request caused; a timer takes it only
when no decision came for this long, on a router with few requests or none, which no
decision waits on. Under load that saves the loop a wake-up of its own per turn."""
RECEIVE_HIGH_WATER_MARK = 10_000
"""Batches a stream's socket holds unread at most (some 20 MB at ~2 kB a batch). Past it ZMQ
stops reading the connection, so the engine's PUB socket queues them and, past its own mark
(SGLang's is 100,000), drops them: the router then sees a sequence gap and replays what the
engine's buffer still holds, or resyncs. Only a router far behind its engines gets there."""
_EVENTS = int(zmq.EVENTS)  # plain ints: the enums' operators run in Python, per message
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_SEQ_END = 1 << 64
"""Past the last batch number (8 bytes, unsigned)."""


@dataclass(frozen=True, slots=True)
class CatchUp:
    """How a catch-up from the replay socket went."""

    answered: bool  # the socket answered at least once
    seen: bool  # it held a batch at or after the start
    complete: bool  # every batch up to the end asked for (or of its buffer) is applied


class _Subscription:
    """One event stream: a worker's, or one DP rank's of it."""

    def __init__(self, hub: KvEventHub, worker: str, endpoints: Endpoints, label: str) -> None:
        self.hub = hub
        self.worker = worker
        self.rank = endpoints.dp_rank
        self.label = label  # the worker, or "worker (DP rank r)", for logs
        self.endpoints = endpoints
        self.expected: int | None = None
        self.seeded = False  # ``expected`` (and the index) came from a peer's snapshot
        self.replayed_through: int | None = None
        self.batches = 0
        self.lock = asyncio.Lock()  # one sequence of updates at a time (reader or monitor)
        self.task: asyncio.Task[None] | None = None
        self.monitor_task: asyncio.Task[None] | None = None
        self.retry_task: asyncio.Task[None] | None = None  # a failed catch-up, asked again
        self.confirm_task: asyncio.Task[None] | None = None  # the second catch-up on connect
        self.retries = 0  # failed catch-ups in a row
        self.behind = False  # the last catch-up did not reach the end of the engine's buffer
        self.lag = 0  # batches the engine published that this stream knows it has not applied
        self.subscriber: ZmtpSubscriber | None = None  # a tcp:// stream, read without libzmq
        self._stopped = False
        # The per-batch counters, looked up once (``labels`` costs a lock and a dict lookup
        # per call); a departed worker's series, removed before its streams stop, are not
        # brought back by a batch applied meanwhile.
        events = hub.metrics.kv_events
        self.stored_events = events.labels(worker, "BlockStored")
        self.removed_events = events.labels(worker, "BlockRemoved")

    def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        address = tcp_address(self.endpoints.events)
        if address is not None:
            self.subscriber = ZmtpSubscriber(
                *address, self.endpoints.topic.encode("utf-8"), self.hub.readers,
                self._connected, self._disconnected, self._take_pending, RECEIVE_HIGH_WATER_MARK,
                self.label,
            )  # fmt: skip
            self.subscriber.start()
            return
        ctx = self.hub.context
        self.socket = ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, self.endpoints.topic.encode("utf-8"))
        self.socket.setsockopt(zmq.RCVHWM, RECEIVE_HIGH_WATER_MARK)
        monitor = self.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.socket.connect(self.endpoints.events)
        self.drain: zmq.Socket[bytes] = zmq.Socket.shadow(self.socket.underlying)  # no futures
        self.fd = int(self.drain.getsockopt(zmq.FD))
        loop.add_reader(self.fd, self._read)
        loop.call_soon(self._read)  # the descriptor signals changes only: read what came first
        self.monitor_task = loop.create_task(self._watch(monitor))

    async def stop(self) -> None:
        self._stopped = True  # first: nothing read from here on starts a task
        if self.subscriber is not None:
            await self.subscriber.close()
        else:
            self.loop.remove_reader(self.fd)
        while tasks := [
            t
            for t in (self.task, self.monitor_task, self.retry_task, self.confirm_task)
            if t is not None and not t.done()
        ]:
            await cancel_and_wait(tasks)
        if self.subscriber is not None:
            return
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        self.socket.close(linger=0)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Connection changes on libzmq's socket (`_connected`, `_disconnected`)."""
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    await self._disconnected()
                elif event["event"] == zmq.EVENT_CONNECTED:
                    await self._connected()
                self._read()  # what came while the lock was held
        finally:
            stop_monitor(self.socket, monitor)

    async def _connected(self) -> None:
        """On every (re)connect the index is rebuilt from the engine's replay buffer, so even
        event. `CONFIRM_AFTER_CONNECT_SECONDS` later, what was published meanwhile is asked
        for once more (`_confirm_later`)."""
        async with self.lock:
            answered = await self._catch_up_from_start()
        if self.confirm_task is not None:
            self.confirm_task.cancel()
        # Only after a catch-up that answered: a retry comes late enough to see it all itself.
        if not self._stopped and answered:
            self.confirm_task = self.loop.create_task(
                self._confirm_later(CONFIRM_AFTER_CONNECT_SECONDS)
            )

    async def _confirm_later(self, delay: float) -> None:
        """The batches after the last one applied, from the replay socket: those published
        before the publisher took the subscription into account (see
        `CONFIRM_AFTER_CONNECT_SECONDS`). One that came live meanwhile is skipped. Not counted
        as a replay (it is routine); a batch it finds is counted as a gap."""
        await asyncio.sleep(delay)
        replay = self.endpoints.replay
        async with self.lock:
            if self._stopped or replay is None:
                return
            before = self.expected  # None: the buffer was empty
            await self._replay_runs(replay, before or 0, counted=False)  # live ones wait
            if self.expected is not None and self.expected != before:
                self.hub.metrics.kv_event_gaps.labels(self.worker).inc()
                log.warning(
                    "%s: KV events %d..%d were published before the subscription took; replayed",
                    self.label, before or 0, self.expected - 1,
                )  # fmt: skip
        self._read()  # what came while the lock was held

    async def _disconnected(self) -> None:
        """A lost publisher's blocks are dropped at once."""
        if self.retry_task is not None:
            self.retry_task.cancel()  # the reconnect catches up anew, with every retry
        if self.confirm_task is not None:
            self.confirm_task.cancel()
        self.retries = 0
        async with self.lock:
            self.hub.resync(self.worker, "publisher_disconnected", self.rank)
            self.expected = None
            self.replayed_through = None
            self.behind = False
            self._set_lag(0)

    def _read(self) -> None:
        """Apply what is queued on the socket, in order, without awaiting (the event loop calls
        this when the socket's descriptor signals). The next batch in sequence is applied at
        once; any other (the first one seen, a gap, a restart, one after a catch-up) goes to
        `_receive_awaiting`, which may ask the replay socket and so must await, and reading
        resumes when it is done. Nothing is read while the lock is held: its holder reads on
        when it releases it. The descriptor is edge-triggered, so a read always goes on until
        the socket has nothing left, or is rescheduled. While busy it still reads the
        socket's events: that clears the descriptor's signal, which otherwise stays set and
        has the loop call this again at once, a busy spin for the whole catch-up."""
        if self._stopped:
            return
        if self.subscriber is not None:
            self._take_pending()
            return
        drain = self.drain
        get, recv = drain.get, drain.recv
        if self.task is not None or self.lock.locked():
            with contextlib.suppress(zmq.ZMQError):  # closed under us (stopping)
                get(_EVENTS)
            return
        for _ in range(DRAIN_MAX_MESSAGES):
            try:
                if not int(get(_EVENTS)) & _POLLIN:
                    return
                frames = [recv(_NOBLOCK)]  # recv_multipart, without its per-frame enum work
                while get(_RCVMORE):
                    frames.append(recv(_NOBLOCK))
            except zmq.ZMQError:
                return  # closed under us (stopping)
            if not self._take(frames):
                return
        self.loop.call_soon(self._read)  # more may be queued; the descriptor will not say so

    def _take_pending(self) -> None:
        """`_read` for a `ZmtpSubscriber`'s stream: the messages it has already parsed. The
        usual run, the next batches in sequence, is applied by the reader itself (compiled,
        `ZmtpReader.apply_in_order`); any other message goes through `_take`. The
        subscriber hands its messages on here directly."""
        if self._stopped or self.task is not None or self.lock.locked():
            return  # they wait, bounded (`RECEIVE_HIGH_WATER_MARK`); read when it is free
        assert self.subscriber is not None
        pending = self.subscriber.pending
        budget = DRAIN_MAX_MESSAGES
        while pending and budget > 0:
            expected = self.expected
            if self.replayed_through is None and expected is not None and 0 <= expected < _SEQ_END:
                applied, stored, removed = pending.apply_in_order(
                    self.hub.index, self.worker, self.rank, expected, budget
                )
                if applied:
                    self.expected = expected + applied
                    self.batches += applied
                    if stored:
                        self.stored_events.inc(stored)
                    if removed:
                        self.removed_events.inc(removed)
                    budget -= applied
                    continue
            if not self._take(pending.popleft()):
                return
            budget -= 1
        if pending:
            self.loop.call_soon(self._read)

    def _take(self, frames: list[bytes]) -> bool:
        """Apply one message if it is the next batch; else hand it to `_receive_awaiting`
        and say to stop reading (False) until that is done."""
        try:
            _, seq, payload = parse_pub_frames(frames)
        except KVEventDecodeError as err:
            self.hub.skip(self.worker, self.label, err)
            return True
        if seq != self.expected or self.replayed_through is not None:
            self.task = self.loop.create_task(self._receive_awaiting(seq, payload))
            return False
        try:
            self.apply(payload)
        except Exception:  # a bug must not end the subscription
            log.exception("%s: could not apply KV-event batch %d", self.label, seq)
            return True
        self.expected = seq + 1
        return True

    async def _receive_awaiting(self, seq: int, payload: bytes) -> None:
        try:
            async with self.lock:
                try:
                    await self.receive(seq, payload)
                except Exception:  # a bug must not end the subscription
                    log.exception("%s: could not apply KV-event batch %d", self.label, seq)
        finally:
            self.task = None
        self._read()

    async def _catch_up_from_start(self) -> bool:
        """Apply everything the engine's replay buffer holds (what it cached before we came),
        or, starting from a peer's snapshot, what came after it. A seeded stream is replayed
        from the snapshot's last batch: an engine that no longer has it (nor anything later)
        restarted since, and the snapshot's blocks are dropped for a replay from 0. False when
        the replay socket did not answer (or there is none); a catch-up that did not reach
        the end of the buffer is asked again later (`_retry_catch_up`)."""
        replay = self.endpoints.replay
        if replay is None:
            return False
        seeded, self.seeded = self.seeded, False
        last = self.expected - 1 if seeded and self.expected else None
        start = (self.expected or 0) if last is None else last
        caught = await self._replay_runs(replay, start)
        if last is not None and not caught.seen:
            self.hub.resync(self.worker, "engine_restart", self.rank)
            self.expected = None
            caught = await self._replay_runs(replay, 0)
        if not caught.complete:
            self._retry_catch_up()
        else:
            self.retries = 0
        return caught.answered

    def _retry_catch_up(self) -> None:
        """After a catch-up that fell short, ask again later (`CATCH_UP_RETRY_SECONDS`),
        unless a batch comes first (its gap catches up itself) or the publisher is lost (its
        reconnect does)."""
        if self._stopped or self.retries >= len(CATCH_UP_RETRY_SECONDS):
            return
        running = self.retry_task
        if running is not None and not running.done() and running is not asyncio.current_task():
            return
        delay = CATCH_UP_RETRY_SECONDS[self.retries]
        self.retries += 1
        self.retry_task = self.loop.create_task(self._catch_up_later(delay))

    async def _catch_up_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        async with self.lock:
            if self.behind and not self._stopped:
                log.info("%s: asking the replay socket again", self.label)
                await self._catch_up_from_start()
        self._read()  # what came while the lock was held

    async def receive(self, seq: int, payload: bytes) -> None:
        """A batch out of the usual order: the first after a catch-up, a gap, a restart."""
        hub = self.hub
        if self.replayed_through is not None:
            if seq <= self.replayed_through:
                return  # a live copy of a batch the catch-up replay already applied
            self.replayed_through = None
        replay = self.endpoints.replay
        expected = self.expected
        if expected is not None and seq < expected:
            hub.resync(self.worker, "engine_restart", self.rank)
            self.expected = None
            if replay is not None:
                await self._replay_runs(replay, 0, seq)  # the new engine's batches before it
        elif expected is None:
            if seq > 0 and replay is not None:
                await self._replay_runs(replay, 0, seq)  # the buffer may start after 0
        elif seq > expected:
            hub.metrics.kv_event_gaps.labels(self.worker).inc()
            log.warning("%s: KV events %d..%d lost; replaying", self.label, expected, seq - 1)
            self._set_lag(seq - expected)
            if replay is None or not (await self._replay_runs(replay, expected, seq)).complete:
                hub.resync(self.worker, "gap_unrecoverable", self.rank)
        self.apply(payload)
        self.expected = seq + 1
        self.replayed_through = None
        self.behind = False
        self._set_lag(0)

    async def _replay_runs(
        self, endpoint: str, start: int, end: int | None = None, *, counted: bool = True
    ) -> CatchUp:
        """Apply the engine's buffered batches from ``start`` (up to ``end``-1, or to the end
        of its buffer) in rounds (`tpuserve_router.kv.kv_replay`): each round's run without a
        hole is applied at once (`_take_run`), and the next round asks from the first batch
        still missing, so what was applied is kept and a replay that loses batches on the way
        (a busy router, a busy engine) still ends whole. Counted as one replay, ``ok`` when
        it got to the end; the batches known and not yet applied are the stream's lag."""
        context = self.hub.context
        ask = start
        answered = seen = complete = False
        for _ in range(REPLAY_MAX_ROUNDS):
            answer = await read_round(context, endpoint, ask, end)
            if answer is None:
                break
            answered = True
            if not answer.batches:  # the end marker, nothing after what was applied
                complete = True
                break
            seen = True
            run = leading_run(answer.batches)
            self._take_run(run)
            ask = run[-1][0] + 1
            if (end is not None and ask >= end) or (
                answer.ended and len(run) == len(answer.batches)
            ):
                complete = True
                break
            self._set_lag(max(answer.batches[-1][0] + 1, end or 0) - ask)
            log.info(
                "%s: the replay from %s lost batches after %d; asking again from there",
                self.label, endpoint, ask - 1,
            )  # fmt: skip
        self.behind = not complete
        if complete:
            self._set_lag(0)
        if counted:
            self.hub.metrics.kv_event_replays.labels(
                self.worker, "ok" if complete else "failed"
            ).inc()
        return CatchUp(answered=answered, seen=seen, complete=complete)

    def _take_run(self, run: list[tuple[int, bytes]]) -> None:
        """Apply a run of batches without a hole, those not applied yet. A run that starts
        after the next batch the stream expects means the engine no longer holds that batch
        (its buffer wrapped): what the index knew of the stream is dropped first."""
        expected = self.expected
        if expected is not None:
            if run[-1][0] < expected:
                return  # older than what is applied: nothing new
            if run[0][0] > expected:
                self.hub.resync(self.worker, "gap_unrecoverable", self.rank)
                expected = None
        for seq, payload in run:
            if expected is None or seq >= expected:
                self.apply(payload)
        self.expected = run[-1][0] + 1
        self.replayed_through = run[-1][0]

    def _set_lag(self, batches: int) -> None:
        """This stream's lag; the worker's gauge is the sum over its streams (DP ranks)."""
        if batches == self.lag:
            return
        self.lag = batches
        if not self._stopped:
            lag = sum(sub.lag for sub in self.hub.subscriptions(self.worker))
            self.hub.metrics.kv_event_lag.labels(self.worker).set(lag)

    def apply(self, payload: bytes) -> None:
        hub = self.hub
        worker = self.worker
        common = hub.index.apply_batch(worker, payload, self.rank)
        if common is None:  # not the usual batch: decoded here, which names what is wrong
            common = self._apply_decoded(payload)
            if common is None:
                return
        self.batches += 1
        stored, removed = common
        if stored:
            self.stored_events.inc(stored)
        if removed:
            self.removed_events.inc(removed)

    def _apply_decoded(self, payload: bytes) -> tuple[int, int] | None:
        """Decode and apply a batch event by event: (stored, removed) events, or None when the
        payload is not a batch at all. What cannot be read is skipped and counted."""
        hub = self.hub
        skipped: list[KVEventDecodeError] = []
        try:
            batch = decode_batch(payload, skipped)
        except KVEventDecodeError as err:
            hub.skip(self.worker, self.label, err)
            return None
        for problem in skipped:
            hub.skip(self.worker, self.label, problem)
        index = hub.index
        worker = self.worker
        rank = self.rank
        stored = removed = 0
        for event in batch.events:
            try:
                if isinstance(event, BlockStored):
                    index.store(
                        worker,
                        event.block_hashes,
                        event.parent_block_hash,
                        event.token_ids,
                        event.block_size,
                        rank,
                        event.medium,
                    )
                    stored += 1
                elif isinstance(event, BlockRemoved):
                    index.remove(worker, event.block_hashes, rank, event.medium)
                    removed += 1
                elif isinstance(event, AllBlocksCleared):
                    hub.metrics.kv_events.labels(worker, "AllBlocksCleared").inc()
                    hub.resync(worker, "all_blocks_cleared", rank)
            except (TypeError, ValueError, OverflowError) as bad:  # e.g. ids not 64-bit ints
                malformed = KVEventDecodeError("malformed_event", f"{event!r:.80}: {bad}")
                hub.skip(worker, self.label, malformed)
        return stored, removed


LOST_REASONS = frozenset({"publisher_disconnected", "engine_restart"})
"""Resyncs that mean the engine lost what it held (it died, or came back empty), not only
that this router lost track of it."""


class KvEventHub:
    """Owns every worker's subscriptions; the app calls ``watch``/``unwatch`` as workers change."""

    def __init__(
        self,
        index: BlockIndex,
        metrics: RouterMetrics,
        resume: Callable[[_Subscription], None] | None = None,
        lost: Callable[[str, int | None], None] | None = None,
    ) -> None:
        self.index = index
        self.lost = lost  # told before a dead or restarted engine's blocks are dropped
        self.metrics = metrics
        self.resume = resume  # where a new stream starts: a peer's snapshot may say
        self.context = zmq.asyncio.Context()  # replay sockets, and streams other than tcp://
        self.readers = SubscriberGroup(READ_INTERVAL_SECONDS, READ_BACKSTOP_SECONDS)
        self._subscriptions: dict[str, tuple[_Subscription, ...]] = {}
        self._logged: set[tuple[str, str]] = set()

    def endpoints(self, worker: str) -> tuple[Endpoints, ...]:
        return tuple(sub.endpoints for sub in self._subscriptions.get(worker, ()))

    def subscriptions(self, worker: str) -> tuple[_Subscription, ...]:
        """The worker's streams (one per DP rank), empty when it is not subscribed."""
        return self._subscriptions.get(worker, ())

    def streams(self) -> list[_Subscription]:
        """Every worker's streams."""
        return [sub for subs in self._subscriptions.values() for sub in subs]

    async def watch(self, worker: str, endpoints: Sequence[Endpoints]) -> None:
        """Subscribe to the worker's streams (again, if they changed)."""
        if not endpoints:
            raise ValueError(f"worker {worker}: no KV-event endpoints to subscribe to")
        if self.endpoints(worker) == tuple(endpoints):
            return
        await self.unwatch(worker)
        several = len(endpoints) > 1
        subscriptions = tuple(
            _Subscription(self, worker, e, f"{worker} (DP rank {e.dp_rank})" if several else worker)
            for e in endpoints
        )
        self._subscriptions[worker] = subscriptions
        self.index.mark_event_feed(worker)
        if self.resume is not None:
            for subscription in subscriptions:
                self.resume(subscription)
        for subscription in subscriptions:
            subscription.start()
        log.info(
            "subscribed to KV events of %s at %s", worker, ", ".join(e.events for e in endpoints)
        )

    async def unwatch(self, worker: str) -> None:
        for subscription in self._subscriptions.pop(worker, ()):
            await subscription.stop()
        self._logged = {logged for logged in self._logged if logged[0] != worker}

    async def stop(self) -> None:
        for worker in list(self._subscriptions):
            await self.unwatch(worker)
        self.readers.close()
        self.context.term()

    def resync(self, worker: str, reason: str, rank: int | None = None) -> None:
        """Drop what the index knows of the worker (of one DP rank's stream, given ``rank``);
        when its engine is gone (``LOST_REASONS``), ``lost`` is told first (the `precise`
        policy's successors, `policies.failover`)."""
        if self.lost is not None and reason in LOST_REASONS:
            self.lost(worker, rank)
        self.index.clear(worker, rank)
        self.metrics.kv_event_resyncs.labels(worker, reason).inc()

    def skip(self, worker: str, label: str, err: KVEventDecodeError) -> None:
        """Count a message or event the router cannot use; log each reason once per worker."""
        self.metrics.kv_events_skipped.labels(worker, err.reason).inc()
        if (worker, err.reason) in self._logged:
            log.debug("%s: skipped KV events (%s): %s", label, err.reason, err)
            return
        self._logged.add((worker, err.reason))
        log.warning(
            "%s: skipped KV events (%s): %s; further ones are only counted "
            "(tpuserve_router_kv_events_skipped_total)",
            label, err.reason, err,
        )  # fmt: skip
