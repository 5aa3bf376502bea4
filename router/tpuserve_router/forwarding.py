"""The generation routes: route a request with the policy and proxy it to a worker, retrying.

A generation request's life: over ``--max-in-flight`` requests already, 503 with
Retry-After; else parse and validate the body (400 naming the field; 413 for a prompt over
``--max-prompt-chars``, before it is tokenized), find the workers serving its model or LoRA
adapter (`WorkerRegistry.route`; 404 listing the served ones; an adapter's warm replicas
first, `adapter_affinity`), ask the policy (503 with Retry-After if none is healthy), count
it in flight on the chosen worker, send it. A failure before the first byte reaches the
client is retried on another worker under the one rule of `tpuserve_router.retry`; nothing
is retried once the client has received bytes. A stream that breaks ends with an SSE error
event and the connection closes.

A try (`Forwarder._attempt`) opens a connection to the worker and sends the request; the
answer is relayed whole (`_relay_whole`: one of known length, read before anything is sent)
or streamed (`_relay_stream`: chunked, passed on as it comes). Every way a try can end returns
a `TryOutcome`, and `_ended` accounts for it in one place, on every path (the client gone
too): tokens and quota (`ledger`, which a prefill/decode pair's answer goes in too), the
abort of what the worker may still be generating, the worker's in-flight count and
connection, the policy and the peers, the request's series. The router's own in-flight count
is decremented in a ``finally``, so it too returns to zero on every path.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from tpuserve_router.adapter_affinity import AdapterAffinity
from tpuserve_router.auth import DEFAULT_PRIORITY, ApiKey, KeyStore, presented_key
from tpuserve_router.cancellation import Aborter
from tpuserve_router.core import RouterCore
from tpuserve_router.generation_limits import GENERATION_LIMITS, GenerationLimit
from tpuserve_router.hold import HoldQueues, HoldRefused, hold_label
from tpuserve_router.metrics import KV_TIERS
from tpuserve_router.outliers import OutlierDetector
from tpuserve_router.pd_settings import PdSettings
from tpuserve_router.policies.base import OUTCOMES, Decision, NoHealthyWorker, RouteRequest
from tpuserve_router.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.quotas import KeyQuota, Quotas, Refusal, Reservation, in_flight_limits
from tpuserve_router.replies import (
    model_not_found,
    reject,
    reply_error,
    sse_error_event,
    unauthorized,
    unavailable,
)
from tpuserve_router.request_body import (
    ClientError,
    ParsedBody,
    Parser,
    Tokens,
    parse_json_object,
)
from tpuserve_router.request_ids import Restorer, client_rid, name_request
from tpuserve_router.retry import (
    ANSWERED,
    FREE_RETRIES,
    RETRY,
    RETRYABLE_STATUSES,
    Attempt,
    RetryBudget,
    retryable_error,
    should_retry,
)
from tpuserve_router.server import Handler, HttpRequest
from tpuserve_router.usage import TokenCounts, usage_from_body, usage_from_stream_tail
from tpuserve_router.workers import ModelRoute, Worker

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"expect",
    }
)
CREDENTIALS: Final = frozenset({b"authorization", b"x-api-key"})
TIMEOUTS: Final = frozenset({"first_byte_timeout", "request_timeout"})  # answered 504
ABANDONED: Final = frozenset(
    {"first_byte_timeout", "stream_stalled", "request_timeout", "response_too_large", "worker_down"}
)
"""Failures after which the worker may still be generating: it is asked to abort."""
CLIENT_CLOSED: Final = "499"  # nginx's code for "the client went away first"
STREAM_ERROR: Final = "stream_error"


@dataclass(frozen=True, slots=True)
class Routed:
    """A generation request on its way to a worker: what each try of it sends, and what its
    answer is counted under."""

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


@dataclass(frozen=True, slots=True)
class TryOutcome:
    """How one try ended: what `Forwarder._ended` accounts for."""

    attempt: Attempt = ANSWERED
    status: str = CLIENT_CLOSED
    """The ``tpuserve_router_requests_total`` status of an answered try."""
    succeeded: bool = False
    """The worker answered below 400 (the policy hears it)."""
    abandoned: str = ""
    """Why the worker should stop the request, if it should (its abort's reason)."""
    relayed: bool = False
    """The worker's whole answer reached the client: its tokens are counted and spent."""
    usage: TokenCounts | None = None


@dataclass(slots=True)
class Spend:
    """What one request of an API key costs: the tokens it reserved of the key's limit, and
    how its last try ended, which settles them (`charge`; the rules are `quotas`')."""

    key: ApiKey
    quota: KeyQuota
    prompt_tokens: int
    """The router's count (or estimate) of its prompt tokens."""
    completion_tokens: int
    """The completion tokens it may generate, as reserved."""
    reservation: Reservation
    outcome: TryOutcome | None = None
    """How its last try ended (None: no try did)."""
    stream_tail: bytes = b""
    """The end of its stream as relayed, when the client left it or it broke."""

    def charge(self) -> tuple[int, int, int]:
        """(prompt, completion) tokens the request is charged, never negative, and what it
        takes of its key's minute: the same, but at least its reservation if it was
        abandoned (the worker may have generated that much before the abort reached it)."""
        outcome = self.outcome
        if outcome is None:
            return 0, 0, 0
        usage = outcome.usage
        if outcome.relayed:
            if usage is not None:
                return usage[0], usage[1], usage[0] + usage[1]
            if outcome.succeeded:  # no usage: what it may have cost
                return self.prompt_tokens, self.completion_tokens, self.reservation.tokens
            return 0, 0, 0  # an error answer
        if outcome.abandoned == "client_gone" or outcome.status == STREAM_ERROR:
            if self.stream_tail:
                usage = usage_from_stream_tail(self.stream_tail)
            if usage is None:
                usage = (self.prompt_tokens, self.completion_tokens, 0)
            return usage[0], usage[1], max(usage[0] + usage[1], self.reservation.tokens)
        return 0, 0, 0  # no worker answered it


UNFINISHED: Final = TryOutcome()
"""A try an unexpected error ended: counted as the client's."""
CLIENT_GONE: Final = TryOutcome(abandoned="client_gone")
RETRIED: Final = TryOutcome(RETRY)


class PairRouter(Protocol):
    """What the forwarder asks of PD mode (`tpuserve_router.pd.PdRouter`, made by the app):
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

    async def forward(
        self,
        routed: Routed,
        route_request: RouteRequest,
        workers: Sequence[Worker],
        how: str,
        adapter: str | None = None,
    ) -> bool: ...


class Forwarder:
    """Routes and proxies generation requests; one per router."""

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
        self.policy = policy = core.policy
        self.registry = registry = core.registry
        self.metrics = metrics = core.metrics
        self.peers = core.peers
        self.tokenizer = tokenizer
        self.outliers = outliers
        self.aborter = aborter
        self.affinity = AdapterAffinity()
        registry.on_removed.append(lambda worker: self.affinity.forget(worker.name))
        self.want_text = policy.needs_text
        self.max_prompt_chars = config.max_prompt_chars
        self.max_in_flight = config.max_in_flight
        self.max_retries = config.max_retries
        self.first_byte = config.first_byte_budget()
        self.in_flight = 0  # generation requests between arrival (or the hold) and answer
        self.keys = keys
        # With the router's own keys, a client's key is the router's business: not the workers'.
        self._not_forwarded = HOP_BY_HOP if keys is None else HOP_BY_HOP | CREDENTIALS
        self.quotas = quotas if quotas is not None else Quotas()
        self.holds = holds
        self.hold_models = frozenset(config.hold_models)
        self.on_arrival = on_arrival
        self.before_decision = before_decision
        self._shed_at = in_flight_limits(config.max_in_flight)
        self.budget = RetryBudget(
            config.retry_budget_percent,
            config.retry_budget_min,
            metrics.retries_over_budget.labels().inc,
        )
        # Children whose labels never change, bound once; the others are looked up in their
        # family (the one cache of children) through lookups bound here.
        self._decisions = {o: metrics.decisions.labels(policy.name, o) for o in OUTCOMES}
        self._ratio_predicted = metrics.prefix_match_ratio.labels(policy.name, "predicted")
        self._ratio_actual = metrics.prefix_match_ratio.labels(policy.name, "actual")
        self._tier_hbm, self._tier_host = (
            metrics.predicted_cached_tokens_by_tier.labels(policy.name, tier) for tier in KV_TIERS
        )
        self._requests = metrics.requests.labels
        self._e2e = metrics.e2e.labels
        self._ttft = metrics.ttft.labels
        self._prompt_tokens = metrics.prompt_tokens.child
        self._completion_tokens = metrics.completion_tokens.child
        self._cached_tokens = metrics.cached_tokens.child
        self._predicted_tokens = metrics.predicted_cached_tokens.child
        self._tenant_requests = metrics.tenant_requests.labels
        self._tenant_tokens = metrics.tenant_tokens.labels
        # PD mode (`tpuserve_router.pd.PdRouter`, which the app makes for this forwarder)
        self.pd: PairRouter | None = None if pair_router is None else pair_router(self)

    def handler(self, route: str, parser: Parser) -> Handler:
        """The handler of one generation route (``parser`` reads its body)."""
        return functools.partial(self.generate, route=route, parser=parser)

    async def generate(self, request: HttpRequest, route: str, parser: Parser) -> None:
        key: ApiKey | None = None
        limit = self.max_in_flight
        if self.keys is not None:
            key = self._admit(request, route)
            if key is None:
                return
            limit = self._shed_at[key.priority]
        if self.in_flight >= limit:
            if key is not None:
                self.metrics.shed.labels(key.priority).inc()
            reject(
                request,
                unavailable(
                    f"the router has {self.in_flight} requests in flight, its limit "
                    + ("(--max-in-flight)" if key is None else f"for {key.priority} requests")
                    + "; retry"
                ),
                self.metrics,
                route,
            )
            return
        counted = False  # a held request is not in flight: it would shed other models' ones
        retries = 0
        spend: Spend | None = None
        try:
            try:
                data = parse_json_object(request.body)
                parsed = parser(data, self.want_text, self.tokenizer, self.max_prompt_chars)
                bound = GENERATION_LIMITS[route](data)
                theirs = client_rid(data)
            except ClientError as err:
                reject(request, err, self.metrics, route)
                return
            del data  # the body's objects: not kept while the request waits
            model = parsed.model
            served = self.registry.route(model, parsed.lora_path)
            since = request.arrived
            held = self.holds.enabled and self._must_hold(model)
            if self.on_arrival is not None:
                self.on_arrival(held)
            if held:
                label = hold_label(model, self._known_models())  # bounded, as a metric label
                try:
                    await self.holds.hold(
                        label, request.arrived, functools.partial(self._routable, model),
                        tenant=key.tenant if key is not None else f"client {request.peer_host}",
                        priority=key.priority if key is not None else DEFAULT_PRIORITY,
                        size=request.charged,
                        admissible=functools.partial(self._has_room, limit),
                    )  # fmt: skip
                except HoldRefused as refused:
                    reject(request, unavailable(str(refused)), self.metrics, route, label)
                    return
                served = self.registry.route(model, parsed.lora_path)
                since = time.monotonic()
            self.in_flight += 1
            counted = True
            if served is None:
                reject(request, self._not_served(model, parsed.lora_path), self.metrics, route)
                return
            parsed.model = served.model  # from here on the served name: a bounded label
            candidates = served.workers
            if key is not None:
                spend = self._reserve(request, route, key, parsed, bound, candidates)
                if spend is None:
                    return
            first = candidates
            if served.adapter is not None:
                first = self.affinity.candidates(served.adapter, candidates)
            route_request = RouteRequest(model, parsed.text, parsed.token_ids)
            ids = name_request(request.body, theirs, parsed.single)
            forwarded = _forwarded_headers(request, ids.body, self._not_forwarded)
            routed = Routed(
                request, route, parsed, forwarded, ids.rid, key, since, ids.restorer, spend
            )
            excluded: list[Worker] = []
            policy = self.policy
            if self.before_decision is not None:
                self.before_decision()
            pd = self.pd
            if pd is not None:  # prefill/decode workers are routed as pairs, never alone
                candidates = [w for w in candidates if w.role is None]
                first = candidates  # an adapter's warm pairs do not narrow the colocated ones
                if served.adapter is not None:
                    first = self.affinity.candidates(served.adapter, candidates)
                if not pd.pair_possible(served.workers):
                    pd = None
                    self.metrics.pd_requests.labels("no_prefill").inc()
                else:
                    prompt_tokens = parsed.prompt_tokens
                    uncached = pd.uncached_tokens(route_request, candidates, prompt_tokens)
                    if (
                        pd.settings.policy == "always"
                        or not any(w.healthy for w in candidates)
                        or (uncached is not None and pd.stalls(uncached, prompt_tokens))
                    ):  # no colocated worker holds enough of it: a pair, before any choice
                        pd = None
                        if await self.pd_forward(routed, route_request, served):
                            return
                    # else the worker the policy chooses decides (it may not be the one
                    # holding the prefix: a policy balancing load makes the prefill whole)
            while True:
                # a retry goes to any other candidate, warm or not
                others = [w for w in candidates if w not in excluded] if excluded else candidates
                pool = others if excluded else first
                try:
                    decision = policy.choose(route_request, pool)
                except NoHealthyWorker:
                    reject(
                        request,
                        unavailable(
                            f"no healthy worker for model {model!r}"
                            if model
                            else "no healthy worker"
                        ),
                        self.metrics,
                        route,
                        served.model,
                    )
                    return
                if pd is not None:  # conditional PD: the first choice decides
                    chosen = decision.worker  # prefill queued there before this one
                    queued = (
                        policy.queued_prefill_tokens(chosen.name)
                        - decision.pending_units
                        + chosen.peer_prefill_tokens
                    )
                    if pd.disaggregates(decision, parsed.prompt_tokens, queued):
                        policy.on_set_aside(decision)  # not acted on: its prediction undone
                        if await self.pd_forward(routed, route_request, served):
                            return
                        pd = None
                        continue
                    self.metrics.pd_requests.labels("colocated").inc()
                    pd = None
                self._decisions[decision.outcome].inc()
                if self.peers is not None:
                    self.peers.routed(decision)
                if served.adapter is not None:
                    self.affinity.routed(served.adapter, decision.worker.name)
                if await self._attempt(routed, decision, retries, others) is ANSWERED:
                    return
                if not retries:
                    self.budget.active += 1  # held until the request ends
                excluded.append(decision.worker)
                retries += 1
                self.metrics.retries.labels(route).inc()
        finally:
            if counted:
                self.in_flight -= 1
                if self.holds.total:
                    self.holds.announce()  # room for a held request, maybe
            if retries:
                self.budget.active -= 1
            if spend is not None:
                self._settle(spend)

    async def pd_forward(
        self, routed: Routed, route_request: RouteRequest, served: ModelRoute
    ) -> bool:
        """Serve ``routed`` on prefill/decode pairs of ``served``'s workers
        (`tpuserve_router.pd`; an adapter's warm ones first); False when no pair could take
        it (nothing was sent)."""
        assert self.pd is not None
        return await self.pd.forward(
            routed, route_request, served.workers, "disaggregated", served.adapter
        )

    def _has_room(self, limit: int) -> bool:
        """Live traffic under ``limit`` in flight would be admitted now (a held request
        leaves the queue through the same admission)."""
        return self.in_flight < limit

    def _not_served(self, model: str, lora_path: str | None) -> ClientError:
        name = f"{model!r}" + (f" with LoRA adapter {lora_path!r}" if lora_path else "")
        return model_not_found(name, [n for n, _ in self.registry.served()])

    def _must_hold(self, model: str) -> bool:
        """Whether a request for ``model`` waits in the hold queue: others of its queue
        wait already, or no worker of its base model is routable (an unknown model is held
        only while no worker at all is routable, or if it is one of --hold-models). A
        request whose adapter no routable worker has while its model has some is answered
        at once (404 or 503): held, it would block its model's queue for nothing."""
        if self.holds.total and self.holds.held(hold_label(model, self._known_models())):
            return True
        return not self._routable(model)

    def _routable(self, model: str) -> bool:
        """A worker of ``model``'s base model, whatever adapter was asked, could take a
        request now (or, for a model no worker serves, the answer would be a 404 rather
        than a wait)."""
        base, _adapter = self.registry.split_model(model)
        served = self.registry.route(base)
        if served is None:
            return model not in self.hold_models and self.registry.healthy_count() > 0
        workers = served.workers
        if self.pd is not None:  # a prefill or a decode engine alone takes nothing: a pair
            colocated = (w for w in workers if w.role is None)
            return any(w.healthy for w in colocated) or self.pd.pair_possible(workers)
        return any(w.healthy for w in workers)

    def _known_models(self) -> frozenset[str]:
        return self.hold_models.union(self.registry.by_model)

    def _retry(
        self,
        retryable: bool,
        retries: int,
        worker: Worker,
        candidates: list[Worker],
        reason: str = "",
    ) -> bool:
        """`should_retry` with this router's budget (unless ``reason`` spends none)."""
        budget = None if reason in FREE_RETRIES else self.budget
        return should_retry(
            retryable, retries, self.max_retries, worker, candidates, budget, self.in_flight
        )

    async def _attempt(
        self, routed: Routed, decision: Decision[Worker], retries: int, candidates: list[Worker]
    ) -> Attempt:
        """One try on the decided worker, after ``retries`` earlier ones; ``candidates`` are
        the workers this try could have gone to (a retry picks among the others). Each way
        it can go returns a `TryOutcome`, which `_ended` accounts for, whatever the path."""
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
            payload = _upstream_request(routed.request, pool.host_header, routed.forwarded)
            upstream = await pool.open(
                lambda conn: self._send(conn, payload, routed.since, first_byte, alive)
            )
            worker.answered_at = time.monotonic()
            status = upstream.status
            if status in RETRYABLE_STATUSES and self._retry(True, retries, worker, candidates):
                outcome = self._refused(worker, status)
            elif upstream.header(b"content-length") is not None or not _is_chunked(upstream):
                outcome = await self._relay_whole(routed, decision, upstream, retries, candidates)
            else:
                outcome = await self._relay_stream(routed, decision, upstream, model)
            if upstream.done and upstream.error is not None:  # bytes past the answer's end
                self._worker_failed(worker, upstream.error.reason)
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
        self._prefill_done(decision)
        status = upstream.status
        usage = usage_from_body(body) if status == 200 else None
        if routed.restorer is not None:
            body = routed.restorer.whole(body)
        routed.request.respond(status, _response_headers(upstream.headers), body)
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
        request.start_chunked(status, _response_headers(upstream.headers))
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
                    self._prefill_done(decision)
                    if routed.parsed.stream:
                        self._ttft(model).observe(time.monotonic() - request.arrived)
                request.write_chunk(data if restorer is None else restorer.chunk(data))
                before, last = last, data
                if request.write_paused:
                    await request.drain()
        except UpstreamError as err:
            self._worker_failed(decision.worker, err.reason)
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
        if status < 500:
            self.outliers.succeeded(worker)
        else:
            self._worker_failed(worker, "server_error")
        return TryOutcome(status=str(status), succeeded=status < 400, relayed=True, usage=usage)

    def _ended(
        self,
        routed: Routed,
        decision: Decision[Worker],
        model: str,
        upstream: UpstreamConnection | None,
        outcome: TryOutcome,
    ) -> None:
        """Account for a try, however it ended: the answer's tokens (and how it ended, which
        settles the request's cost to the client's key), the worker asked to stop what it may
        still be generating, its in-flight count and connection given back, the policy and
        the peers told, and an answered request counted."""
        worker = decision.worker
        self.ledger(routed, worker.name, model, outcome, decision)
        rid = routed.rid
        if outcome.abandoned and rid is not None and (upstream is None or not upstream.done):
            self.aborter.abort(worker.name, rid, outcome.abandoned)
        worker.in_flight -= 1
        if upstream is not None:
            pool: UpstreamPool = worker.pool
            pool.release(upstream)
        self.policy.on_request_done(decision, outcome.succeeded)
        if self.peers is not None:
            self.peers.ended(decision)

    def ledger(
        self,
        routed: Routed,
        worker: str,
        model: str,
        outcome: TryOutcome,
        decision: Decision[Worker] | None = None,
    ) -> None:
        """The one ledger of a try, on a colocated worker (`_ended`) or a prefill/decode
        pair (`pd`, ``worker`` its decode): the answer's tokens, how it ended (which settles
        the request's cost to the client's key, `Spend.charge`), and an answered request
        counted (499: the client left first). ``decision`` predicted how much of the prompt
        the worker holds (None: no prediction is counted)."""
        if outcome.relayed and outcome.usage is not None:
            self._account(outcome.usage, decision, model, worker)
        if outcome.attempt is not ANSWERED:
            return
        if routed.spend is not None:
            routed.spend.outcome = outcome
        status = outcome.status
        self._requests(model, worker, routed.route, status).inc()
        key = routed.key
        if key is not None:
            self._tenant_requests(key.label, key.priority, status).inc()
        if status != CLIENT_CLOSED:
            self._e2e(model, routed.route).observe(time.monotonic() - routed.request.arrived)

    def _prefill_done(self, decision: Decision[Worker]) -> None:
        """The first byte came back: the policy's booked prefill is released, here and at
        the peers."""
        self.policy.on_prefill_done(decision)
        if self.peers is not None:
            self.peers.prefill_done(decision)

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
        self._worker_failed(worker, err.reason)
        return self._retry(retryable_error(err), retries, worker, candidates, err.reason)

    def _worker_failed(self, worker: Worker, reason: str) -> None:
        self.metrics.upstream_errors.labels(worker.name, reason).inc()
        self.outliers.failed(worker)

    def _admit(self, request: HttpRequest, route: str) -> ApiKey | None:
        """The request's API key if it is valid and within its rate limits; else answered
        (401, 429) and None."""
        assert self.keys is not None
        authorization = api_key = None
        for name, value in request.headers:
            if name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
        presented = presented_key(authorization, api_key)
        key = self.keys.authenticate(presented)
        if key is None:
            self.metrics.auth_failures.labels("missing" if not presented else "invalid").inc()
            reject(request, unauthorized(presented), self.metrics, route)
            return None
        quota = self.quotas.of(key, request.arrived)
        refused = quota.admit(request.arrived)
        if refused is not None:
            self._rate_limited(request, route, key, *refused)
            return None
        request.extra_headers = quota.headers()
        return key

    def _rate_limited(
        self,
        request: HttpRequest,
        route: str,
        key: ApiKey,
        refusal: Refusal,
        headers: dict[str, str],
    ) -> None:
        """Answer 429 for a key over its limits."""
        self.metrics.rate_limited.labels(key.label, refusal.limit).inc()
        wait = refusal.retry_after_seconds
        message = refusal.message or (
            f"rate limit reached for {refusal.limit} per minute ({refusal.per_minute}, "
            f"tenant {key.tenant}); retry in {wait or 0:.3g} s"
        )
        error = ClientError(
            429, message, param=refusal.param, error_type="rate_limit_exceeded", headers=headers
        )
        reject(request, error, self.metrics, route)

    def _reserve(
        self,
        request: HttpRequest,
        route: str,
        key: ApiKey,
        parsed: ParsedBody,
        bound: GenerationLimit,
        workers: list[Worker],
    ) -> Spend | None:
        """Reserve what the request may cost of its key's token limit (`quotas`); None if it
        does not fit (answered 429)."""
        quota = self.quotas.of(key, request.arrived)
        contexts = [w.context_tokens for w in workers if w.context_tokens is not None]
        prompt = parsed.prompt_tokens
        # nothing bounds it: what is left of the key's whole minute (no limit: nothing)
        rest = max(0, quota.tokens.per_minute - prompt) if quota.tokens is not None else 0
        completion = bound.allowance(prompt, max(contexts, default=None), rest)
        reserved = quota.reserve(prompt + completion, time.monotonic(), bound.param)
        if not isinstance(reserved, Reservation):
            self._rate_limited(request, route, key, *reserved)
            return None
        request.extra_headers = quota.headers()
        return Spend(key, quota, prompt, completion, reserved)

    def _settle(self, spend: Spend) -> None:
        """Charge a key's request what it cost, once, as it ends (`quotas`)."""
        prompt, completion, taken = spend.charge()
        spend.quota.settle(spend.reservation, taken, time.monotonic())
        label = spend.key.label
        self._tenant_tokens(label, "prompt").inc(prompt)
        self._tenant_tokens(label, "completion").inc(completion)

    def _account(
        self, usage: TokenCounts, decision: Decision[Worker] | None, model: str, worker: str
    ) -> None:
        key = (model, worker)
        prompt, completion, cached = usage
        self._prompt_tokens(key).inc(prompt)
        self._completion_tokens(key).inc(completion)
        self._cached_tokens(key).inc(cached)
        predicted = self._predicted_tokens(key)  # the series exists at zero too
        if decision is None:
            return
        ratio = decision.predicted_match_ratio
        if ratio is not None and prompt > 0:
            tokens = round(ratio * prompt)
            predicted.inc(tokens)
            host = round(decision.predicted_host_ratio * prompt)
            self._tier_hbm.inc(tokens - host)
            self._tier_host.inc(host)
            self._ratio_predicted.observe(ratio)
            self._ratio_actual.observe(min(1.0, cached / prompt))


def _abandoned(err: UpstreamError) -> str:
    """Why the worker should stop a request that failed with ``err`` ("": it has stopped)."""
    return "gave_up" if err.reason in ABANDONED else ""


def _connection_named(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The headers a ``Connection`` header names: hop-by-hop as well (RFC 9110 7.6.1), not
    passed on (names lower case)."""
    named = [
        token.strip().lower()
        for name, value in headers
        if name == b"connection"
        for token in value.split(b",")
    ]
    return frozenset(token for token in named if token)


def _forwarded_headers(request: HttpRequest, body: bytes, dropped: frozenset[bytes]) -> bytes:
    """The client's headers but ``dropped`` and those its ``Connection`` names, and ``body``,
    framed: all of a request after its host."""
    named = _connection_named(request.headers)
    if named:
        dropped = dropped | named
    return b"".join(
        [name + b": " + value + b"\r\n" for name, value in request.headers if name not in dropped]
        + [b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body]
    )


def _upstream_request(request: HttpRequest, host: bytes, headers_and_body: bytes) -> bytes:
    target = request.path.encode("latin-1")
    if request.query:
        target += b"?" + request.query.encode("latin-1")
    return b"".join(
        (request.method, b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n", headers_and_body)
    )


def _response_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Upstream response headers to pass on (names arrive lower-cased from the proxy): not
    the hop-by-hop ones, nor those its ``Connection`` names."""
    named = _connection_named(headers)
    dropped = HOP_BY_HOP | named if named else HOP_BY_HOP
    return b"".join(
        [name + b": " + value + b"\r\n" for name, value in headers if name not in dropped]
    )


def _is_chunked(upstream: UpstreamConnection) -> bool:
    value = upstream.header(b"transfer-encoding")
    return value is not None and b"chunked" in value.lower()


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
