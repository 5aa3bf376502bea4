"""The generation routes: route a request with the policy and proxy it to a worker, retrying.

A generation request's life: over ``--max-in-flight`` requests already, 503 with
Retry-After; else parse and validate the body (400 naming the field; 413 for a prompt over
``--max-prompt-chars``, before it is tokenized), find the workers serving its model or LoRA
adapter (`WorkerRegistry.route`; 404 listing the served ones; an adapter's warm replicas
first, `adapter_affinity`), ask the policy (503 with Retry-After if none is healthy), count
it in flight on the chosen worker, send it. A failure before the first byte reaches the
client is retried on another worker under the one rule of `tpuserve_router.retry`; nothing
is retried once the client has received bytes. A stream that breaks ends with an SSE error
event and the connection closes. The in-flight count is decremented in a ``finally``, so it
returns to zero on every path.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Final

from tpuserve_router.adapter_affinity import AdapterAffinity
from tpuserve_router.auth import ApiKey, KeyStore, presented_key
from tpuserve_router.cancellation import Aborter, new_rid, with_rid
from tpuserve_router.core import RouterCore
from tpuserve_router.hold import HoldQueues, HoldRefused, hold_label
from tpuserve_router.outliers import OutlierDetector
from tpuserve_router.policies.base import OUTCOMES, Decision, NoHealthyWorker, RouteRequest
from tpuserve_router.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.quotas import Quotas, in_flight_limits
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
from tpuserve_router.workers import Worker

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


class Forwarder:
    """Routes and proxies generation requests; one per router."""

    def __init__(
        self,
        core: RouterCore,
        tokenizer: Tokens | None,
        outliers: OutlierDetector,
        aborter: Aborter,
        keys: KeyStore | None = None,
    ) -> None:
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
        self.quotas = Quotas()
        self.holds = HoldQueues(config.hold_max_requests, config.hold_max_seconds, metrics)
        self.hold_models = frozenset(config.hold_models)
        self.on_arrival: Callable[[bool], None] | None = None  # the demand signal, if any
        # what must run before a routing decision: the KV events' due read, if any
        self.before_decision: Callable[[], None] | None = None
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
        self._requests = metrics.requests.labels
        self._e2e = metrics.e2e.labels
        self._ttft = metrics.ttft.labels
        self._prompt_tokens = metrics.prompt_tokens.child
        self._completion_tokens = metrics.completion_tokens.child
        self._cached_tokens = metrics.cached_tokens.child
        self._predicted_tokens = metrics.predicted_cached_tokens.child
        self._tenant_requests = metrics.tenant_requests.labels
        self._tenant_tokens = metrics.tenant_tokens.labels

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
        try:
            try:
                parsed = parser(
                    parse_json_object(request.body), self.want_text, self.tokenizer,
                    self.max_prompt_chars,
                )  # fmt: skip
            except ClientError as err:
                reject(request, err, self.metrics, route)
                return
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
                        label, request.arrived, functools.partial(self._routable, model)
                    )
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
            first = candidates
            if served.adapter is not None:
                first = self.affinity.candidates(served.adapter, candidates)
            route_request = RouteRequest(model, parsed.text, parsed.token_ids)
            body = request.body
            rid = parsed.rid if parsed.single else None  # what names it on the engine
            if parsed.single and rid is None:
                rid = new_rid()
                body = with_rid(body, rid)
            forwarded = _forwarded_headers(request, body, self._not_forwarded)
            excluded: list[Worker] = []
            policy = self.policy
            if self.before_decision is not None:
                self.before_decision()
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
                self._decisions[decision.outcome].inc()
                if self.peers is not None:
                    self.peers.routed(decision)
                if served.adapter is not None:
                    self.affinity.routed(served.adapter, decision.worker.name)
                attempt = await self._attempt(
                    request, route, parsed, decision, forwarded, rid, retries, others, key, since
                )
                if attempt is ANSWERED:
                    return
                if not retries:
                    self.budget.active += 1  # held until the request ends
                excluded.append(decision.worker)
                retries += 1
                self.metrics.retries.labels(route).inc()
        finally:
            if counted:
                self.in_flight -= 1
            if retries:
                self.budget.active -= 1

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
        return any(w.healthy for w in served.workers)

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
        self,
        request: HttpRequest,
        route: str,
        parsed: ParsedBody,
        decision: Decision[Worker],
        headers_and_body: bytes,
        rid: str | None,
        retries: int,
        candidates: list[Worker],
        key: ApiKey | None,
        since: float,
    ) -> Attempt:
        """One try on the decided worker, after ``retries`` earlier ones; ``candidates``
        are the workers this try could have gone to (a retry picks among the others).
        ``headers_and_body`` follow the request line and host; ``rid`` names the request
        on the worker (to abort it), if it can be named; ``key`` is the client's API key;
        ``--request-timeout`` runs from ``since`` (its arrival, or its leaving the hold
        queue: the time it waited for a worker to exist is not taken from its answer's)."""
        worker = decision.worker
        policy = self.policy
        model = parsed.model
        stream = parsed.stream
        if not model and worker.models:
            model = worker.models[0]
        pool: UpstreamPool = worker.pool
        upstream: UpstreamConnection | None = None
        succeeded = False
        result: Attempt = ANSWERED
        status_label = CLIENT_CLOSED  # the requests_total status, unless retried
        sent = False
        abandoned = ""  # why the worker should stop this request (ABORT_REASONS), if it should
        first_byte = self.first_byte.seconds(
            parsed.prompt_tokens, parsed.max_new_tokens, stream, worker.in_flight
        )
        worker.in_flight += 1
        try:
            payload = _upstream_request(request, pool.host_header, headers_and_body)
            try:
                sent = True
                upstream = await pool.open(
                    lambda conn: self._send(conn, payload, since, first_byte)
                )
            except UpstreamError as err:
                abandoned = _abandoned(err)
                if self._failed_before_answer(err, worker, retries, candidates):
                    result = RETRY
                    return result
                if err.reason in TIMEOUTS:
                    status_label = "504"
                    reply_error(
                        request,
                        ClientError(
                            504, f"worker did not answer: {err.detail}", error_type="timeout"
                        ),
                    )
                    return result
                status_label = "502"
                reply_error(
                    request,
                    ClientError(
                        502, f"worker unavailable: {err.detail}", error_type="upstream_error"
                    ),
                )
                return result
            status = upstream.status
            if status in RETRYABLE_STATUSES and self._retry(True, retries, worker, candidates):
                self.metrics.upstream_errors.labels(worker.name, "retryable_status").inc()
                if status >= 500:
                    self.outliers.failed(worker)
                result = RETRY
                return result
            headers = _response_headers(upstream.headers)
            usage: TokenCounts | None
            if upstream.header(b"content-length") is not None or not _is_chunked(upstream):
                try:
                    body = await upstream.read_all()
                except UpstreamError as err:
                    abandoned = _abandoned(err)
                    if self._failed_before_answer(err, worker, retries, candidates):
                        result = RETRY
                        return result
                    code = 504 if err.reason == "request_timeout" else 502
                    status_label = str(code)
                    reply_error(
                        request,
                        ClientError(
                            code,
                            f"worker failed mid-response: {err.detail}",
                            error_type="upstream_error",
                        ),
                    )
                    return result
                self._prefill_done(decision)
                request.respond(status, headers, body)
                usage = usage_from_body(body) if status == 200 else None
            else:
                request.start_chunked(status, headers)
                upstream.watch_progress()
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
                            if stream:
                                self._ttft(model).observe(time.monotonic() - request.arrived)
                        request.write_chunk(data)
                        before, last = last, data
                        if request.write_paused:
                            await request.drain()
                except UpstreamError as err:
                    abandoned = _abandoned(err)
                    self._worker_failed(worker, err.reason)
                    what = "stalled" if err.reason == "stream_stalled" else "broke"
                    request.write_chunk(
                        sse_error_event(f"the worker's stream {what}: {err.detail}")
                    )
                    request.end_chunked(keep_alive=False)
                    status_label = STREAM_ERROR
                    return result
                request.end_chunked()
                usage = usage_from_stream_tail(before + last) if status == 200 else None
            succeeded = status < 400
            if status < 500:
                self.outliers.succeeded(worker)
            else:
                self._worker_failed(worker, "server_error")
            status_label = str(status)
            if usage is not None:
                self._account(usage, decision, model, worker.name)
            if key is not None:
                self._spend(key, usage, parsed)
            return result
        except asyncio.CancelledError:  # the client went away (or stopped reading)
            abandoned = "client_gone"
            raise
        finally:
            if abandoned and rid is not None and sent and (upstream is None or not upstream.done):
                self.aborter.abort(worker.name, rid, abandoned)
            worker.in_flight -= 1
            if upstream is not None:
                pool.release(upstream)
            policy.on_request_done(decision, succeeded)
            if self.peers is not None:
                self.peers.ended(decision)
            if result is ANSWERED:
                self._requests(model, worker.name, route, status_label).inc()
                if key is not None:
                    self._tenant_requests(key.label, key.priority, status_label).inc()
                if status_label != CLIENT_CLOSED:
                    self._e2e(model, route).observe(time.monotonic() - request.arrived)

    def _prefill_done(self, decision: Decision[Worker]) -> None:
        """The first byte came back: the policy's booked prefill is released, here and at
        the peers."""
        self.policy.on_prefill_done(decision)
        if self.peers is not None:
            self.peers.prefill_done(decision)

    async def _send(
        self, upstream: UpstreamConnection, payload: bytes, arrived: float, first_byte: float
    ) -> None:
        """Write the request and wait for the response head (`UpstreamPool.open`'s send)."""
        upstream.send(payload)
        left = self.config.request_timeout_seconds - (time.monotonic() - arrived)
        upstream.set_deadlines(
            first_byte, max(0.001, left), self.config.stream_idle_timeout_seconds
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
        if refused is None:
            request.extra_headers = quota.headers()
        else:
            refusal, headers = refused
            self.metrics.rate_limited.labels(key.label, refusal.limit).inc()
            reject(
                request,
                ClientError(
                    429,
                    f"rate limit reached for {refusal.limit} per minute "
                    f"({refusal.per_minute}, tenant {key.tenant}); retry in "
                    f"{refusal.retry_after_seconds:.3g} s",
                    error_type="rate_limit_exceeded",
                    headers=headers,
                ),
                self.metrics,
                route,
            )
            return None
        return key

    def _spend(self, key: ApiKey, usage: TokenCounts | None, parsed: ParsedBody) -> None:
        if usage is not None:
            prompt, completion, _ = usage
        else:  # no usage in the answer: what it may have cost
            prompt, completion = parsed.prompt_tokens, parsed.max_new_tokens or 0
        self.quotas.spend_tokens(key, prompt + completion, time.monotonic())
        self._tenant_tokens(key.label, "prompt").inc(prompt)
        self._tenant_tokens(key.label, "completion").inc(completion)

    def _account(
        self, usage: TokenCounts, decision: Decision[Worker], model: str, worker: str
    ) -> None:
        key = (model, worker)
        prompt, completion, cached = usage
        self._prompt_tokens(key).inc(prompt)
        self._completion_tokens(key).inc(completion)
        self._cached_tokens(key).inc(cached)
        predicted = self._predicted_tokens(key)  # the series exists at zero too
        ratio = decision.predicted_match_ratio
        if ratio is not None and prompt > 0:
            predicted.inc(round(ratio * prompt))
            self._ratio_predicted.observe(ratio)
            self._ratio_actual.observe(min(1.0, cached / prompt))


def _abandoned(err: UpstreamError) -> str:
    """Why the worker should stop a request that failed with ``err`` ("": it has stopped)."""
    return "gave_up" if err.reason in ABANDONED else ""


def _forwarded_headers(request: HttpRequest, body: bytes, dropped: frozenset[bytes]) -> bytes:
    """The client's headers but ``dropped``, and ``body``, framed: all of a request after its
    host."""
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
    """Upstream response headers to pass on (names arrive lower-cased from the proxy)."""
    return b"".join(
        [name + b": " + value + b"\r\n" for name, value in headers if name not in HOP_BY_HOP]
    )


def _is_chunked(upstream: UpstreamConnection) -> bool:
    value = upstream.header(b"transfer-encoding")
    return value is not None and b"chunked" in value.lower()
