"""The HTTP port's generation routes: the front of the pipeline (`tpuserve_router.pipeline.stages`)
and its colocated relay.

A generation request walks the pipeline's stages in order (`Forwarder.generate`): **admit**
(`Pipeline.admit`: key and limits, ``--max-in-flight`` (503 with Retry-After), the body
parsed and validated (400 naming the field; 413 for a prompt over ``--max-prompt-chars``),
the hold queue, the workers serving its model or LoRA adapter (404 listing the served
ones), its tokens reserved); **select** (`Pipeline.select`: the policy's choice, an
adapter's warm replicas first, 503 with Retry-After if none is healthy; in PD mode a
prefill/decode pair, `tpuserve_router.front.pd`); **relay** (`Forwarder.relay`, or
`PdRouter.relay` for a pair); **account** (`Ledger.account`). A failure before the first byte
reaches the client is retried on another worker under the one rule of
`tpuserve_router.pipeline.retry`: selection and relay again; nothing is retried once the
client has received bytes. A stream that breaks
ends with an SSE error event and the connection closes.

A try (`Forwarder.relay`) opens a connection to the worker and sends the request; the
answer is relayed whole (`_relay_whole`: one of known length, read before anything is sent)
or streamed (`_relay_stream`: chunked, passed on as it comes). Every way a try can end returns
a `TryOutcome`, and `_ended` accounts for it in one place, on every path (the client gone
too): the ledger (tokens, quota, series, policy and peers), the abort of what the worker may
still be generating, the worker's in-flight count and connection. The router's own in-flight
count is given back in a ``finally`` (`Pipeline.leave`), so it too returns to zero on every
path.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from tpuserve_router.core import RouterCore
from tpuserve_router.engines.outliers import OutlierDetector
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.engines.workers import Worker
from tpuserve_router.front.framing import (
    CREDENTIALS,
    HOP_BY_HOP,
    forwarded_headers,
    is_chunked,
    response_headers,
    upstream_request,
)
from tpuserve_router.front.replies import reply_error, sse_error_event
from tpuserve_router.front.server import Handler, HttpRequest
from tpuserve_router.pipeline.cancellation import Aborter
from tpuserve_router.pipeline.deadlines import first_byte_budget
from tpuserve_router.pipeline.ledger import (
    CLIENT_GONE,
    RETRIED,
    STREAM_ERROR,
    UNFINISHED,
    Ledger,
    Spend,
    TryOutcome,
)
from tpuserve_router.pipeline.pd_settings import PdSettings
from tpuserve_router.pipeline.request_body import ClientError, ParsedBody, Parser, Tokens
from tpuserve_router.pipeline.request_ids import Restorer, name_request
from tpuserve_router.pipeline.retry import (
    ANSWERED,
    RETRY,
    RETRYABLE_STATUSES,
    Attempt,
    RetryBudget,
    free_retry,
    retryable_error,
    should_retry,
)
from tpuserve_router.pipeline.stages import Admitted, Arrival, Pipeline, Refused
from tpuserve_router.pipeline.usage import TokenCounts, usage_from_body, usage_from_stream_tail
from tpuserve_router.policies.base import Decision, NoHealthyWorker, RouteRequest
from tpuserve_router.tenancy.auth import ApiKey, KeyStore
from tpuserve_router.tenancy.hold import HoldQueues
from tpuserve_router.tenancy.quotas import Quotas

TIMEOUTS: Final = frozenset({"first_byte_timeout", "request_timeout"})  # answered 504
ABANDONED: Final = frozenset(
    {"first_byte_timeout", "stream_stalled", "request_timeout", "response_too_large", "worker_down"}
)
"""Failures after which the worker may still be generating: it is asked to abort."""


@dataclass(frozen=True, slots=True)
class Routed:
    """A generation request on its way to a worker: what each try of it sends, and what its
    answer is counted under (a `ledger.Bill`)."""

    request: HttpRequest
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

    @property
    def arrived(self) -> float:
        return self.request.arrived


class PairRouter(Protocol):
    """What the forwarder asks of PD mode (`tpuserve_router.front.pd.PdRouter`, made by the app):
    whether a request goes to a pair, and serving it on one."""

    settings: PdSettings

    def pair_possible(self, workers: Sequence[Worker]) -> bool: ...

    def uncached_tokens(
        self, route_request: RouteRequest, colocated: Sequence[Worker], prompt_tokens: int
    ) -> float | None: ...

    def stalls(self, uncached: float, prompt_tokens: int, queued_tokens: int = 0) -> bool: ...

    def disaggregates(
        self, decision: Decision[Worker], prompt_tokens: int, queued_tokens: int = 0
    ) -> bool: ...

    async def forward(self, routed: Routed, admitted: Admitted, how: str) -> bool: ...


class Forwarder:
    """The HTTP port's front of the pipeline and its colocated relay; one per router."""

    def __init__(
        self,
        core: RouterCore,
        tokenizer: Tokens | None,
        outliers: OutlierDetector,
        aborter: Aborter,
        holds: HoldQueues,
        *,
        keys: KeyStore | None = None,
        quotas: Quotas | None = None,
        before_decision: Callable[[], None] | None = None,
        on_arrival: Callable[[bool], None] | None = None,
        pair_router: Callable[[Forwarder], PairRouter] | None = None,
    ) -> None:
        """``holds`` are the hold queues; with ``keys`` (the router's own API keys) a
        request is admitted by its key and ``quotas``; ``before_decision`` runs before
        every routing decision (the KV events' due read), ``on_arrival`` on every arrival,
        told whether it is held (the demand signal)."""
        self.config = config = core.config
        self.policy = core.policy
        self.registry = core.registry
        self.metrics = metrics = core.metrics
        self.peers = core.peers
        self.outliers = outliers
        self.aborter = aborter
        self.ledger = Ledger(core, outliers)
        self.pipeline = pipeline = Pipeline(
            core, tokenizer, self.ledger, holds, keys=keys, quotas=quotas,
            before_decision=before_decision, on_arrival=on_arrival,
        )  # fmt: skip
        # what the admission stage owns, named here too (the app and its tests read them)
        self.tokenizer = tokenizer
        self.holds = holds
        self.keys = keys
        self.quotas = pipeline.quotas
        self.affinity = pipeline.affinity
        self.before_decision = before_decision
        self.want_text = pipeline.want_text
        self.max_prompt_chars = pipeline.max_prompt_chars
        self.max_in_flight = pipeline.max_in_flight
        self.max_retries = config.max_retries
        self.first_byte = first_byte_budget(config)
        # With the router's own keys, a client's key is the router's business: not the workers'.
        self._not_forwarded = HOP_BY_HOP if keys is None else HOP_BY_HOP | CREDENTIALS
        self.budget = RetryBudget(
            config.retry_budget_percent,
            config.retry_budget_min,
            metrics.retries_over_budget.labels().inc,
        )
        # PD mode (`tpuserve_router.front.pd.PdRouter`, which the app makes for this forwarder)
        self.pd: PairRouter | None = None if pair_router is None else pair_router(self)
        if self.pd is not None:
            pipeline.pair_possible = self.pd.pair_possible

    @property
    def in_flight(self) -> int:
        """Generation requests between admission (or the hold) and answer, every mode's."""
        return self.pipeline.in_flight

    def handler(self, route: str, parser: Parser) -> Handler:
        """The handler of one generation route (``parser`` reads its body)."""
        return functools.partial(self.generate, route=route, parser=parser)

    async def generate(self, request: HttpRequest, route: str, parser: Parser) -> None:
        """One request's walk: admit, then select and relay (again for a retry), each try
        accounted in the ledger as it ends; a refusal answered as an HTTP error."""
        pipeline = self.pipeline
        arrival = Arrival(
            route, parser, request.body, request.arrived, request.headers,
            client=request.peer_host, size=request.charged,
        )  # fmt: skip
        admitted: Admitted | None = None
        try:
            admitted = await pipeline.admit(arrival)
            request.extra_headers = arrival.reply_headers
            pipeline.enter(admitted)
            await self._select_and_relay(request, admitted)
        except Refused as refused:
            request.extra_headers = arrival.reply_headers
            reply_error(request, refused.error)
            self.ledger.refused(route, refused.model, refused.error.status)
        finally:
            if admitted is not None:
                pipeline.leave(admitted)

    async def _select_and_relay(self, request: HttpRequest, admitted: Admitted) -> None:
        """Select a worker (or a pair) and relay to it, again on another while a try that
        reached the client with nothing may be retried; raises `Refused` (503) when no
        worker can take it."""
        pipeline = self.pipeline
        parsed = admitted.parsed
        ids = name_request(request.body, admitted.theirs, parsed.single)
        forwarded = forwarded_headers(request, ids.body, self._not_forwarded)
        routed = Routed(
            request, admitted.route, parsed, forwarded, ids.rid, admitted.key, admitted.since,
            ids.restorer, admitted.spend,
        )  # fmt: skip
        served = admitted.served
        candidates = served.workers
        pd = self.pd
        if pd is not None:  # prefill/decode workers are routed as pairs, never alone
            candidates = [w for w in candidates if w.role is None]
            if not pd.pair_possible(served.workers):
                pd = None
                self.metrics.pd_requests.labels("no_prefill").inc()
            else:
                if pipeline.before_decision is not None:
                    pipeline.before_decision()  # the prediction reads the KV events
                prompt_tokens = parsed.prompt_tokens
                uncached = pd.uncached_tokens(admitted.route_request, candidates, prompt_tokens)
                if (
                    pd.settings.policy == "always"
                    or not any(w.healthy for w in candidates)
                    or (uncached is not None and pd.stalls(uncached, prompt_tokens))
                ):  # no colocated worker holds enough of it: a pair, before any choice
                    if await pd.forward(routed, admitted, "disaggregated"):
                        return
                    pd = None
                # else the worker the policy chooses decides (it may not be the one
                # holding the prefix: a policy balancing load makes the prefill whole)
        first = pipeline.first_choices(admitted, candidates)
        excluded: list[Worker] = []
        retries = 0
        try:
            while True:
                # a retry goes to any other candidate, warm or not
                others = [w for w in candidates if w not in excluded] if excluded else candidates
                try:
                    decision = pipeline.select(admitted, others if excluded else first)
                except NoHealthyWorker:
                    raise pipeline.no_worker(admitted) from None
                if pd is not None:  # conditional PD: the first choice decides
                    if self._disaggregates(pd, decision, parsed.prompt_tokens):
                        self.policy.on_set_aside(decision)  # not acted on: prediction undone
                        if await pd.forward(routed, admitted, "disaggregated"):
                            return
                        pd = None
                        continue
                    self.metrics.pd_requests.labels("colocated").inc()
                    pd = None
                pipeline.chosen(admitted, decision)
                if await self.relay(routed, decision, retries, others) is ANSWERED:
                    return
                if not retries:
                    self.budget.active += 1  # held until the request ends
                excluded.append(decision.worker)
                retries += 1
                self.metrics.retries.labels(admitted.route).inc()
        finally:
            if retries:
                self.budget.active -= 1

    def _disaggregates(self, pd: PairRouter, decision: Decision[Worker], prompt: int) -> bool:
        """Conditional PD: the prefill the chosen worker would make stalls its decodes."""
        chosen = decision.worker  # prefill queued there before this one
        queued = (
            self.policy.queued_prefill_tokens(chosen.name)
            - decision.pending_units
            + chosen.peer_prefill_tokens
        )
        return pd.disaggregates(decision, prompt, queued)

    def _retry(
        self,
        retryable: bool,
        retries: int,
        worker: Worker,
        candidates: list[Worker],
        free: bool = False,
    ) -> bool:
        """`should_retry` with this router's budget (unless the retry is ``free``)."""
        budget = None if free else self.budget
        return should_retry(
            retryable, retries, self.max_retries, worker, candidates, budget, self.in_flight
        )

    async def relay(
        self, routed: Routed, decision: Decision[Worker], retries: int, candidates: list[Worker]
    ) -> Attempt:
        """One try on the decided worker, after ``retries`` earlier ones; ``candidates`` are
        the workers this try could have gone to (a retry picks among the others). Each way
        it can go returns a `TryOutcome`, which `_ended` accounts for in the ledger, whatever
        the path."""
        worker = decision.worker
        pool: UpstreamPool = worker.pool
        parsed = routed.parsed
        model = parsed.model
        if not model and worker.models:
            model = worker.models[0]
        first_byte = self.first_byte.seconds(
            parsed.prompt_tokens, parsed.max_new_tokens, parsed.stream, worker.in_flight
        )
        alive = None
        if self.config.health_check_interval_seconds > 0:  # probes say whether it is alive
            seconds = self.first_byte.alive_seconds(parsed.prompt_tokens, worker.in_flight)
            alive = (seconds, liveness(worker))
        worker.in_flight += 1
        upstream: UpstreamConnection | None = None
        outcome = UNFINISHED
        sent = time.monotonic()
        try:
            payload = upstream_request(routed.request, pool.host_header, routed.forwarded)
            upstream = await pool.open(
                lambda conn: self._send(conn, payload, routed.since, first_byte, alive)
            )
            worker.answered_at = time.monotonic()
            status = upstream.status
            if status in RETRYABLE_STATUSES and self._retry(True, retries, worker, candidates):
                outcome = self._refused(worker, status)
            elif upstream.header(b"content-length") is not None or not is_chunked(upstream):
                outcome = await self._relay_whole(routed, decision, upstream, retries, candidates)
            else:
                outcome = await self._relay_stream(routed, decision, upstream, model)
            if upstream.done and upstream.error is not None:  # bytes past the answer's end
                self.ledger.worker_failed(worker, upstream.error.reason)
        except UpstreamError as err:  # from `open`: no answer came
            outcome = self._unanswered(routed, err, worker, retries, candidates)
        except asyncio.CancelledError:  # the client went away (or stopped reading)
            outcome = CLIENT_GONE
            if upstream is None and alive is not None and _stuck(worker, sent, alive[0]):
                self.outliers.failed(worker)
            raise
        finally:
            self._ended(routed, decision, model, upstream, outcome)
        return outcome.attempt

    def _unanswered(
        self,
        routed: Routed,
        err: UpstreamError,
        worker: Worker,
        retries: int,
        candidates: list[Worker],
    ) -> TryOutcome:
        """The worker gave no answer (refused, dropped, or timed out before its head): another
        worker takes the request, or the client gets 504 (a timeout) or 502."""
        abandoned = _abandoned(err)
        if self._failed_before_answer(err, worker, retries, candidates):
            return TryOutcome(RETRY, abandoned=abandoned)
        if err.reason in TIMEOUTS:
            message = f"worker did not answer: {err.detail}"
            reply_error(routed.request, ClientError(504, message, error_type="timeout"))
            return TryOutcome(status="504", abandoned=abandoned)
        message = f"worker unavailable: {err.detail}"
        reply_error(routed.request, ClientError(502, message, error_type="upstream_error"))
        return TryOutcome(status="502", abandoned=abandoned)

    def _refused(self, worker: Worker, status: int) -> TryOutcome:
        """The worker answered 429 or 5xx (`RETRYABLE_STATUSES`), and another worker takes the
        request; the answer is dropped."""
        self.metrics.upstream_errors.labels(worker.name, "retryable_status").inc()
        if status >= 500:
            self.outliers.failed(worker)
        return RETRIED

    async def _relay_whole(
        self,
        routed: Routed,
        decision: Decision[Worker],
        upstream: UpstreamConnection,
        retries: int,
        candidates: list[Worker],
    ) -> TryOutcome:
        """An answer of known length (or read to the connection's close) is read whole, then
        sent in one piece: until then nothing reached the client, so a failure reading it
        may still go to another worker."""
        worker = decision.worker
        try:
            body = await upstream.read_all()
        except UpstreamError as err:
            abandoned = _abandoned(err)
            if self._failed_before_answer(err, worker, retries, candidates):
                return TryOutcome(RETRY, abandoned=abandoned)
            code = 504 if err.reason == "request_timeout" else 502
            message = f"worker failed mid-response: {err.detail}"
            reply_error(routed.request, ClientError(code, message, error_type="upstream_error"))
            return TryOutcome(status=str(code), abandoned=abandoned)
        self.ledger.first_byte(decision, "", None)
        status = upstream.status
        usage = usage_from_body(body) if status == 200 else None
        if routed.restorer is not None:
            body = routed.restorer.whole(body)
        routed.request.respond(status, response_headers(upstream.headers), body)
        return self._relayed(worker, status, usage)

    async def _relay_stream(
        self,
        routed: Routed,
        decision: Decision[Worker],
        upstream: UpstreamConnection,
        model: str,
    ) -> TryOutcome:
        """A chunked answer is passed on chunk by chunk as it comes. The client has bytes from
        the first one: a failure after it is never retried, it ends the stream with an SSE
        error event and closes the connection."""
        request = routed.request
        status = upstream.status
        request.start_chunked(status, response_headers(upstream.headers))
        upstream.watch_progress()
        restorer = routed.restorer
        first = True
        before = last = b""
        try:
            while True:
                data = await upstream.read()
                if not data:
                    break
                if first:
                    first = False
                    arrived = request.arrived if routed.parsed.stream else None
                    self.ledger.first_byte(decision, model, arrived)
                request.write_chunk(data if restorer is None else restorer.chunk(data))
                before, last = last, data
                if request.write_paused:
                    await request.drain()
        except UpstreamError as err:
            self.ledger.worker_failed(decision.worker, err.reason)
            if routed.spend is not None:
                routed.spend.stream_tail = before + last
            if restorer is not None:
                request.write_chunk(restorer.rest())
            what = "stalled" if err.reason == "stream_stalled" else "broke"
            request.write_chunk(sse_error_event(f"the worker's stream {what}: {err.detail}"))
            request.end_chunked(keep_alive=False)
            return TryOutcome(status=STREAM_ERROR, abandoned=_abandoned(err))
        except asyncio.CancelledError:  # the client left: what it was sent settles its cost
            if routed.spend is not None:
                routed.spend.stream_tail = before + last
            raise
        if restorer is not None:
            request.write_chunk(restorer.rest())
        request.end_chunked()
        usage = usage_from_stream_tail(before + last) if status == 200 else None
        return self._relayed(decision.worker, status, usage)

    def _relayed(self, worker: Worker, status: int, usage: TokenCounts | None) -> TryOutcome:
        """The worker's whole answer reached the client; a 5xx one counts against it."""
        self.ledger.worker_answered(worker, status)
        return TryOutcome(status=str(status), succeeded=status < 400, relayed=True, usage=usage)

    def _ended(
        self,
        routed: Routed,
        decision: Decision[Worker],
        model: str,
        upstream: UpstreamConnection | None,
        outcome: TryOutcome,
    ) -> None:
        """Account for a try, however it ended: in the ledger (the answer's tokens, how it
        ended, which settles the request's cost to the client's key, the request counted,
        the policy and the peers told), the worker asked to stop what it may still be
        generating, its in-flight count and connection given back."""
        worker = decision.worker
        self.ledger.account(routed, worker.name, model, outcome, decision)
        rid = routed.rid
        if outcome.abandoned and rid is not None and (upstream is None or not upstream.done):
            self.aborter.abort(worker.name, rid, outcome.abandoned)
        worker.in_flight -= 1
        if upstream is not None:
            pool: UpstreamPool = worker.pool
            pool.release(upstream)
        self.ledger.ended(decision, outcome.succeeded)

    async def _send(
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

    def _failed_before_answer(
        self, err: UpstreamError, worker: Worker, retries: int, candidates: list[Worker]
    ) -> bool:
        """Count ``err`` against ``worker`` (nothing reached the client yet); whether the
        request goes to another worker."""
        self.ledger.worker_failed(worker, err.reason)
        return self._retry(retryable_error(err), retries, worker, candidates, free_retry(err))


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
