"""The relay stage for one worker (`tpuserve_router.pipeline.selection.Single`): one try
opens a connection to the worker, sends the request, and passes the answer on whole
(`_relay_whole`: one of known length, read before anything is sent) or streamed
(`_relay_stream`: chunked, passed on as it comes).

Every way a try can end is a `TryOutcome`, which the driver hands to the ledger
(`Ledger.close`); what the try says of its worker (an upstream error, its outlier record)
travels in the outcome's verdicts. A failure before the first byte reaches the client is
retried when the driver's retry rule allows (``retry``); a stream that breaks after it ends
with an SSE error event, and the connection closes. The worker is asked to stop what it may
still be generating (`Aborter`), and its connection is given back, on every path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.engines.workers import Worker
from tpuserve_router.pipeline.cancellation import Aborter
from tpuserve_router.pipeline.client import Client, reply_error, sse_error_event
from tpuserve_router.pipeline.deadlines import FirstByteBudget
from tpuserve_router.pipeline.framing import is_chunked, response_headers, upstream_request
from tpuserve_router.pipeline.ledger import (
    CLIENT_GONE,
    STREAM_ERROR,
    UNFINISHED,
    Ledger,
    Spend,
    TryOutcome,
    Verdict,
)
from tpuserve_router.pipeline.migration import (
    MIGRATES,
    Continuation,
    Encoder,
    Kept,
    Rejoin,
    continue_stream,
)
from tpuserve_router.pipeline.request_body import ClientError, ParsedBody
from tpuserve_router.pipeline.request_ids import Restorer
from tpuserve_router.pipeline.retry import (
    RETRY,
    RETRYABLE_STATUSES,
    free_retry,
    retryable_error,
)
from tpuserve_router.pipeline.selection import Single
from tpuserve_router.pipeline.usage import TokenCounts, usage_from_body, usage_from_stream_tail
from tpuserve_router.tenancy.auth import ApiKey

TIMEOUTS: Final = frozenset({"first_byte_timeout", "request_timeout"})  # answered 504
ABANDONED: Final = frozenset(
    {"first_byte_timeout", "stream_stalled", "request_timeout", "response_too_large", "worker_down"}
)
"""Failures after which the worker may still be generating: it is asked to abort."""

Retry = Callable[[bool, bool], bool]
"""The driver's retry rule for this try: whether a failure (retryable, its retry free of
the budget) goes to another worker."""


@dataclass(frozen=True, slots=True)
class Routed:
    """A generation request on its way to a worker: what each try of it sends, and what its
    answer is counted under (a `ledger.Bill`)."""

    request: Client
    route: str
    parsed: ParsedBody
    forwarded: bytes
    """All of the request after its request line and host: the client's headers but the
    dropped ones, and the body (with the router's id as its rid: `request_ids`)."""
    rid: str | None
    """What names the request alone on the worker, to abort it (None: a batch, or several
    samples)."""
    key: ApiKey | None
    """The client's API key, with the router's own keys."""
    since: float
    """Where ``--request-timeout`` runs from: its arrival, or its leaving the hold queue (the
    time it waited for a worker to exist is not taken from its answer's)."""
    restorer: Restorer | None = None
    """Writes the client's own rid back into the answer (None: it gave none)."""
    spend: Spend | None = None
    """What the request of a key costs (None without API keys)."""
    dropped: frozenset[bytes] = frozenset()
    """The client's headers not passed on (hop-by-hop; with the router's own keys, its
    credentials)."""
    unmigratable: str = "not a stream"
    """Why its stream cannot move to another engine if its own dies ("": it can,
    `migration`)."""
    shown_id: str | None = None
    """The id its answer shows the client (its own ``rid``, else the router's first)."""
    continuation: Continuation | None = None
    """The stream it continues, when this try is a migration's."""

    @property
    def body(self) -> bytes:
        """The body each try sends."""
        return self.forwarded.partition(b"\r\n\r\n")[2]

    @property
    def arrived(self) -> float:
        return self.request.arrived


@dataclass(slots=True)
class Tried:
    """How a try ended, as its relay leaves it (also when the client's leaving cancels it)."""

    outcome: TryOutcome = UNFINISHED
    migrations_left: int = 0
    """Migrations the request may still make (`migration`)."""


class SingleRelay:
    """One try on one worker; one per router."""

    def __init__(
        self,
        config: RouterConfig,
        first_byte: FirstByteBudget,
        ledger: Ledger,
        aborter: Aborter,
        tokens: Callable[[], Encoder],
    ) -> None:
        """``tokens``: the tokenizer a migration counts the tokens sent with."""
        self.config = config
        self.first_byte = first_byte
        self.ledger = ledger
        self.aborter = aborter
        self.tokens = tokens
        self.probes = config.health_check_interval_seconds > 0

    async def relay(self, routed: Routed, single: Single, retry: Retry, tried: Tried) -> None:
        """One try on the decided worker (counted in flight already, `Ledger.started`);
        each way it can go, the client's leaving too, leaves its `TryOutcome` in ``tried``
        for the ledger."""
        decision = single.decision
        worker = decision.worker
        pool: UpstreamPool = worker.pool
        parsed = routed.parsed
        model = parsed.model
        if not model and worker.models:
            model = worker.models[0]
        ahead = worker.in_flight - 1  # this try is counted already
        first_byte = self.first_byte.seconds(
            parsed.prompt_tokens, parsed.max_new_tokens, parsed.stream, ahead
        )
        alive = None
        if self.probes:  # probes say whether it is alive
            seconds = self.first_byte.alive_seconds(parsed.prompt_tokens, ahead)
            alive = (seconds, liveness(worker))
        upstream: UpstreamConnection | None = None
        outcome = UNFINISHED
        sent = time.monotonic()
        try:
            payload = upstream_request(routed.request, pool.host_header, routed.forwarded)
            upstream = await pool.open(
                lambda conn: self.send(conn, payload, routed.since, first_byte, alive)
            )
            worker.answered_at = time.monotonic()
            status = upstream.status
            if status in RETRYABLE_STATUSES and retry(True, False):
                # another worker takes the request; the answer is dropped
                outcome = TryOutcome(
                    RETRY, verdicts=(Verdict(worker, "retryable_status", status >= 500 or None),)
                )
            elif upstream.header(b"content-length") is not None or not is_chunked(upstream):
                outcome = await self._relay_whole(routed, single, upstream, retry)
            else:
                outcome = await self._relay_stream(routed, single, upstream, model, tried)
            if upstream.done and upstream.error is not None:  # bytes past the answer's end
                verdict = Verdict(worker, upstream.error.reason)
                outcome = replace(outcome, verdicts=(*outcome.verdicts, verdict))
        except UpstreamError as err:  # from `open`: no answer came
            outcome = self._unanswered(routed, err, worker, retry)
        except asyncio.CancelledError:  # the client went away (or stopped reading)
            outcome = CLIENT_GONE
            if upstream is None and alive is not None and _stuck(worker, sent, alive[0]):
                outcome = replace(outcome, verdicts=(Verdict(worker),))
            raise
        finally:
            rid = routed.rid
            if outcome.abandoned and rid is not None and (upstream is None or not upstream.done):
                self.aborter.abort(worker.name, rid, outcome.abandoned)
            if upstream is not None:
                pool.release(upstream)
            tried.outcome = outcome

    def _unanswered(
        self, routed: Routed, err: UpstreamError, worker: Worker, retry: Retry
    ) -> TryOutcome:
        """The worker gave no answer (refused, dropped, or timed out before its head): another
        worker takes the request, or the client gets 504 (a timeout) or 502."""
        abandoned = _abandoned(err)
        verdicts = (Verdict(worker, err.reason),)
        if retry(retryable_error(err), free_retry(err)):
            return TryOutcome(RETRY, abandoned=abandoned, verdicts=verdicts)
        if err.reason in TIMEOUTS:
            message = f"worker did not answer: {err.detail}"
            answer_error(routed, ClientError(504, message, error_type="timeout"))
            return TryOutcome(status="504", abandoned=abandoned, verdicts=verdicts)
        message = f"worker unavailable: {err.detail}"
        answer_error(routed, ClientError(502, message, error_type="upstream_error"))
        return TryOutcome(status="502", abandoned=abandoned, verdicts=verdicts)

    async def _relay_whole(
        self, routed: Routed, single: Single, upstream: UpstreamConnection, retry: Retry
    ) -> TryOutcome:
        """An answer of known length (or read to the connection's close) is read whole, then
        sent in one piece: until then nothing reached the client, so a failure reading it
        may still go to another worker."""
        decision = single.decision
        worker = decision.worker
        try:
            body = await upstream.read_all()
        except UpstreamError as err:
            abandoned = _abandoned(err)
            verdicts = (Verdict(worker, err.reason),)
            if retry(retryable_error(err), free_retry(err)):
                return TryOutcome(RETRY, abandoned=abandoned, verdicts=verdicts)
            code = 504 if err.reason == "request_timeout" else 502
            message = f"worker failed mid-response: {err.detail}"
            answer_error(routed, ClientError(code, message, error_type="upstream_error"))
            return TryOutcome(status=str(code), abandoned=abandoned, verdicts=verdicts)
        self.ledger.first_byte(decision, "", None)
        status = upstream.status
        if routed.continuation is not None:  # a moved stream's engine answered no stream
            message = f"the engine it moved to answered {status} without a stream"
            answer_error(routed, ClientError(502, message, error_type="upstream_error"))
            return relayed(worker, status, None)
        usage = usage_from_body(body) if status == 200 else None
        if routed.restorer is not None:
            body = routed.restorer.whole(body)
        routed.request.respond(status, response_headers(upstream.headers), body)
        return relayed(worker, status, usage)

    async def _relay_stream(
        self,
        routed: Routed,
        single: Single,
        upstream: UpstreamConnection,
        model: str,
        tried: Tried,
    ) -> TryOutcome:
        """A chunked answer is passed on chunk by chunk as it comes. The client has bytes from
        the first one: a failure after it is never retried; its engine gone, the stream moves
        to another (`migration`), else it ends with an SSE error event and the connection
        closes."""
        decision = single.decision
        request = routed.request
        status = upstream.status
        continued = routed.continuation
        rejoin = None
        if continued is None:
            request.start_chunked(status, response_headers(upstream.headers))
        else:
            rejoin = continued.rejoin()
        upstream.watch_progress()
        restorer = routed.restorer
        kept = Kept(routed.route) if not routed.unmigratable else None
        first = True
        before = last = b""
        try:
            while True:
                data = await upstream.read()
                if not data:
                    break
                if first:
                    first = False
                    arrived = request.arrived if routed.parsed.stream and not continued else None
                    self.ledger.first_byte(decision, model, arrived)
                if kept is not None:
                    kept.add(data)
                if rejoin is not None:
                    data = rejoin.feed(data)
                request.write_chunk(data if restorer is None else restorer.chunk(data))
                if data:
                    before, last = last, data
                if request.write_paused:
                    await request.drain()
        except UpstreamError as err:
            if routed.spend is not None:
                routed.spend.stream_tail = before + last
            verdicts = (Verdict(decision.worker, err.reason),)
            moved = self.migrate(routed, err, kept, tried, rejoin)
            if isinstance(moved, Continuation):
                return TryOutcome(
                    RETRY, abandoned=_abandoned(err), verdicts=verdicts, continuation=moved
                )
            if restorer is not None:
                request.write_chunk(restorer.rest())
            what = "stalled" if err.reason == "stream_stalled" else "broke"
            why = f"; the stream cannot move to another engine: {moved}" if moved else ""
            request.write_chunk(sse_error_event(f"the worker's stream {what}: {err.detail}{why}"))
            request.end_chunked(keep_alive=False)
            return TryOutcome(
                status=STREAM_ERROR,
                abandoned=_abandoned(err),
                verdicts=verdicts,
                not_migrated=bool(moved),
            )
        except asyncio.CancelledError:  # the client left: what it was sent settles its cost
            if routed.spend is not None:
                routed.spend.stream_tail = before + last
            raise
        if rejoin is not None and rejoin.held:
            rest = rejoin.flush()
            request.write_chunk(rest if restorer is None else restorer.chunk(rest))
            before, last = before + last, rest
        if restorer is not None:
            request.write_chunk(restorer.rest())
        request.end_chunked()
        usage = usage_from_stream_tail(before + last) if status == 200 else None
        return relayed(decision.worker, status, usage)

    def migrate(
        self,
        routed: Routed,
        err: UpstreamError,
        kept: Kept | None,
        tried: Tried,
        rejoin: Rejoin | None = None,
    ) -> Continuation | str:
        """Where a broken stream goes on (`migration`), or why it does not ("": its failure
        is not one a migration answers). ``rejoin``: a continuation's, whose held bytes (an
        event not yet whole) never reached the client."""
        if err.reason not in MIGRATES:
            return ""
        if kept is None:
            return routed.unmigratable
        if tried.migrations_left <= 0:
            return f"it moved {self.config.migration_limit} times (--migration-limit)"
        sent = kept.bytes()
        if isinstance(sent, str):
            return sent
        if rejoin is not None and rejoin.held:
            sent = sent[: len(sent) - len(rejoin.held)]
        tokens = self.tokens()
        moved = continue_stream(
            routed.route, routed.body, sent, routed.continuation, tokens, routed.shown_id
        )
        if isinstance(moved, str):
            return moved
        what = "stalled" if err.reason == "stream_stalled" else "broke"
        return replace(moved, cause=f"the worker's stream {what}: {err.detail}")

    async def send(
        self,
        upstream: UpstreamConnection,
        payload: bytes,
        arrived: float,
        first_byte: float,
        alive: tuple[float, Callable[[], bool | None]] | None = None,
    ) -> None:
        """Write the request and wait for the response head (`UpstreamPool.open`'s send)."""
        upstream.send(payload)
        left = self.config.request_timeout_seconds - (time.monotonic() - arrived)
        upstream.set_deadlines(
            first_byte, max(0.001, left), self.config.stream_idle_timeout_seconds, alive
        )
        await upstream.wait_head()


def answer_error(routed: Routed, err: ClientError) -> None:
    """Answer a try's failure: an error response, or, for a stream already begun (moved to
    another engine, `migration`), an SSE error event that ends it."""
    moved = routed.continuation
    if moved is None:
        reply_error(routed.request, err)
        return
    client = routed.request
    if routed.restorer is not None:
        client.write_chunk(routed.restorer.rest())
    message = f"{moved.cause}; it moved to another engine, which failed: {err.message}"
    client.write_chunk(sse_error_event(message, err.status))
    client.end_chunked(keep_alive=False)


def relayed(worker: Worker, status: int, usage: TokenCounts | None) -> TryOutcome:
    """The worker's whole answer reached the client; a 5xx one counts against it."""
    verdict = Verdict(worker, "server_error") if status >= 500 else Verdict(worker, "", False)
    return TryOutcome(
        status=str(status), succeeded=status < 400, relayed=True, usage=usage, verdicts=(verdict,)
    )


def _abandoned(err: UpstreamError) -> str:
    """Why the worker should stop a request that failed with ``err`` ("": it has stopped)."""
    return "gave_up" if err.reason in ABANDONED else ""


def liveness(worker: Worker) -> Callable[[], bool | None]:
    """Whether ``worker`` has shown it is alive since the request was sent, then since the
    last time it was asked: a health probe passed (True), only failed (False), or none ended
    (None). A request without its answer's head waits past the floor only on True (a hung
    worker's requests fail at the floor and go elsewhere, issue 57 item 8; a slow one that
    answers its probes keeps them up to the whole first-byte timeout)."""
    since = time.monotonic()

    def verdict() -> bool | None:
        nonlocal since
        if worker.probe_passed_at > since:
            since = time.monotonic()
            return True
        return False if worker.probe_failed_at > since else None

    return verdict


def _stuck(worker: Worker, sent: float, alive_seconds: float) -> bool:
    """Whether a request whose client left before its answer's head says ``worker`` is
    stuck: it waited past what a stream would get (``alive_seconds``) and the worker sent no
    answer's head to anyone since it was sent. Counted as a failure for outlier ejection
    (issue 57 item 8: an engine whose probes pass but which answers nothing was never ejected,
    as a client leaving counted for nothing); a slow engine still answering others is not."""
    return time.monotonic() - sent >= alive_seconds and worker.answered_at < sent
