"""PD mode: a request goes to a prefill worker and a decode worker at once, as SGLang's PD
contract asks, or to a colocated worker when disaggregating it does not pay.

SGLang 0.5.23's contract (`sglang_tpu.disaggregation`): the same request goes to a prefill
engine and a decode engine concurrently, with ``bootstrap_host`` (the prefill's host),
``bootstrap_port`` (its bootstrap server) and ``bootstrap_room`` (a random 63-bit integer;
lists, rooms ``room + i``, for a batched ``/generate``). The decode engine bootstraps with the
prefill, receives the prompt's KV and streams the answer, which is what the client gets; the
prefill's answer is drained, and its ``input_token_logprobs`` are merged into a non-streamed
``/generate`` answer only when the request asked for ``return_logprob``.

Decisions, per request:

- **whether to disaggregate** (``--pd-policy conditional``, the default): the configured
  policy picks a colocated worker as usual; when the prefill of the prompt's tokens it does
  not expect that worker to hold (the policy's predicted match) would stall that worker's
  running decodes for ``--pd-itl-budget-seconds`` or longer, the request is disaggregated
  instead (a prompt no colocated worker holds enough of is disaggregated before any choice).
  The stall is timed by the performance model of ``--pd-perf-model``: the uncached tokens
  reach the threshold, the shortest uncached prompt that stalls that long
  (`sglang_tpu.disaggregation.threshold_tokens`), or fewer take that long after a long cached
  prefix; ``--pd-threshold-tokens`` replaces the model by a fixed threshold. It is the chosen
  worker's cache that counts, not the best one's: a policy that balances load away from the
  worker holding the prefix makes that prefill whole. A decode engine in SGLang cannot prefill a
  request itself (it refuses one without a room), so "not disaggregated" needs colocated
  workers (``--worker``); with none, every request is disaggregated, and so it is with
  ``--pd-policy always``;
- **the prefill worker**: the configured policy (``precise``: prefix affinity from the
  prefill engines' KV events, and the prefill work queued on each) over the healthy prefill
  workers; **its DP rank**: SGLang serves a room on rank ``room % dp_size``, so the router
  draws the room for a rank of its choosing: the rank the prompt's first page hashes to, so
  every turn of a conversation (same first page) lands on the rank whose radix tree holds its
  prefix, instead of a random one. ``dp_size`` is read once from the prefill's bootstrap
  server (``GET /route`` with -1 ranks);
- **the decode worker**: the healthy one with the fewest requests in flight (the load the
  router sees, polled engine loads included), ties at random: decode capacity is KV room and
  batch slots, which in-flight requests use up.

Failures: a transport error or a non-2xx answer on either leg ends the other (its connection
closed, the engine asked to abort the request's rid); nothing has reached the client yet, so
the request is retried on a new pair with a new room while ``--max-retries`` and the retry
budget allow (a worker that is gone, or a prefill that broke a handoff other than by a
timeout, is retried without asking the budget: a dead prefill fails all its pairs at once).
Each leg counts against its own worker's outlier ejection; a decode that fails
because the KV never came (a bootstrap or transfer failure, or the router's timeout on it
while the prefill had not answered and the decode's probes did not fail) counts against the
prefill. No
healthy prefill (or decode) worker: the request goes to a colocated worker if there is one,
else 503. The router never waits for a leg longer than ``--pd-handoff-timeout-seconds``, at
most the engines' own ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` and ``..._WAITING_TIMEOUT``
(300 s each by default), so it gives up (and aborts both legs) no later than they would.
A stream is committed to the client at the decode's first body chunk; a failure after it ends
the stream with an SSE error event, as in colocated mode.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson

from sglang_tpu import disaggregation
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.engines.worker_session import WorkerSession
from tpuserve_router.engines.workers import Worker
from tpuserve_router.front.forwarding import Forwarder, Routed, liveness
from tpuserve_router.front.framing import forwarded_headers, response_headers, upstream_request
from tpuserve_router.front.replies import reply_error, sse_error_event
from tpuserve_router.pipeline.ledger import CLIENT_GONE, STREAM_ERROR, TryOutcome
from tpuserve_router.pipeline.pd_settings import DECODE, PREFILL, PdSettings
from tpuserve_router.pipeline.refusals import unavailable
from tpuserve_router.pipeline.request_body import ClientError
from tpuserve_router.pipeline.request_ids import Restorer, client_rid, new_rid
from tpuserve_router.pipeline.retry import RETRYABLE_STATUSES
from tpuserve_router.pipeline.stages import Admitted
from tpuserve_router.pipeline.usage import usage_from_body, usage_from_stream_tail
from tpuserve_router.policies.base import Decision, NoHealthyWorker, RouteRequest

log = logging.getLogger(__name__)

FAILURE_KINDS: Final = ("bootstrap", "transfer", "transport", "status", "timeout")
PD_ROUTES: Final = ("disaggregated", "colocated", "no_prefill")
"""How a PD-mode request was served: as a pair; on a colocated worker by choice; on a
colocated worker because no prefill/decode pair was healthy."""
DP_SIZE_TIMEOUT_SECONDS: Final = 2.0
DP_SIZE_RETRY_SECONDS: Final = 30.0
MAX_DP_SIZE_ENTRIES: Final = 4096  # prefill workers remembered (bounded: workers come and go)
ROUTE_INFO_QUERY: Final = {
    "prefill_dp_rank": "-1", "prefill_cp_rank": "-1", "target_tp_rank": "-1",
    "target_pp_rank": "-1",
}  # fmt: skip


class LegFailed(Exception):
    """One leg of a pair failed before the client got anything."""

    def __init__(self, leg: str, kind: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{leg} leg: {detail}")
        self.leg = leg
        self.kind = kind
        self.detail = detail
        self.status = status
        self.body: bytes = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.answered = False  # no retry was left: the client has its answer


@dataclass(frozen=True, slots=True)
class _Named:
    """How one try names the request on its workers: its rid (to abort it; None: not
    abortable) and what writes the client's own id back into the answer."""

    rid: str | None
    restorer: Restorer | None


def _failure_kind(body: bytes) -> str:
    """Whether an engine's error answer is a bootstrap or a transfer failure (SGLang's
    messages: "... KVPoll.Bootstrapping", "bootstrap ...", "... transfer ... failed")."""
    text = body[:2000].lower()
    if b"bootstrap" in text:
        return "bootstrap"
    if b"transfer" in text or b"kvpoll" in text:
        return "transfer"
    return "status"


class PdRouter:
    """Routes requests to prefill/decode pairs; one per router, beside the `Forwarder`."""

    def __init__(
        self,
        forwarder: Forwarder,
        settings: PdSettings,
        session: Callable[[], WorkerSession | None],
        seed: int | None = None,
    ) -> None:
        self.fwd = forwarder
        self.settings = settings
        self.session = session
        self.metrics = forwarder.metrics
        self.random = random.Random(seed)
        self.dp_sizes: dict[str, int] = {}  # prefill worker -> its DP size
        self.dp_size_retry: dict[str, float] = {}  # prefill worker -> when to ask again
        m = self.metrics
        for how in PD_ROUTES:
            m.pd_requests.labels(how)
        for leg in (PREFILL, DECODE):
            for kind in FAILURE_KINDS:
                m.pd_failures.labels(leg, kind)

    # ------------------------------------------------------------------ decisions

    def split(self, workers: Sequence[Worker]) -> tuple[list[Worker], list[Worker]]:
        """(prefill, decode) workers of a request's candidates."""
        return (
            [w for w in workers if w.role == PREFILL],
            [w for w in workers if w.role == DECODE],
        )

    def pair_possible(self, workers: Sequence[Worker]) -> bool:
        prefill, decode = self.split(workers)
        return bool(pairable(prefill, decode))

    def disaggregates(
        self, decision: Decision[Worker], prompt_tokens: int, queued_tokens: int = 0
    ) -> bool:
        """Whether a request the policy sent to a colocated worker goes to a pair instead:
        its prefill there, of the prompt tokens that worker is not expected to hold, after
        the ``queued_tokens`` of other prefills already waiting there (SGLang runs waiting
        prefills back to back before the next decode step), would stall that worker's
        decodes for the ITL budget or longer (`stalls`)."""
        if self.settings.policy == "always":
            return True
        ratio = decision.predicted_match_ratio or 0.0
        return self.stalls(prompt_tokens * (1.0 - ratio), prompt_tokens, queued_tokens)

    def stalls(self, uncached: float, prompt_tokens: int, queued_tokens: int = 0) -> bool:
        """Whether prefilling ``uncached`` tokens of a ``prompt_tokens``-token prompt on a
        colocated worker, after ``queued_tokens`` of other prefills, stalls its running
        decodes for ``--pd-itl-budget-seconds`` or longer: the threshold's tokens or more, or,
        by the performance model, a shorter suffix whose attention over the cached rest takes
        that long (1,000 new tokens after 60,000 cached ones take twice the 50 ms budget on a
        v6e 1x1 with Llama-3.1-8B). With a threshold given as a number (no model), the
        threshold alone."""
        settings = self.settings
        new = math.ceil(uncached)
        return disaggregation.prefill_stalls(
            settings.timer, new + max(0, queued_tokens), max(0, prompt_tokens - new),
            settings.threshold_tokens, settings.itl_budget_seconds,
        )  # fmt: skip

    def uncached_tokens(
        self, route_request: RouteRequest, colocated: Sequence[Worker], prompt_tokens: int
    ) -> float | None:
        """The prompt tokens the best healthy colocated worker is not expected to hold, read
        from the policy's own index without touching it (a choice would record the request
        there, and a prefix the colocated worker never got would then look cached); None
        when the policy keeps no index this can read. When even the best worker's prefill
        would stall (`stalls`), the request goes to a pair without a choice; else the worker
        the policy chooses decides (`disaggregates`; a choice set aside for a pair is undone
        by the policy's ``on_set_aside``: no prediction of the prompt stays on that worker)."""
        healthy = [w for w in colocated if w.healthy]
        if not healthy:
            return None
        policy = self.fwd.policy
        index = policy.block_index
        tokens = route_request.token_ids
        if index is not None and tokens:
            depths = index.match(index.keys(tokens), [w.name for w in healthy])
            return max(0.0, len(tokens) - max(depths, default=0) * index.page_size)
        tree_of = getattr(policy, "tree", None)  # cache_aware's approximate tree
        text = route_request.text
        if callable(tree_of) and text:
            matched = tree_of(route_request.model).match(text)
            held = max((matched.get(w.name, 0) for w in healthy), default=0)
            return prompt_tokens * (1.0 - held / len(text))
        return None

    def _choose_decode(self, decode: Sequence[Worker], model: str) -> Worker:
        healthy = [w for w in decode if w.healthy]
        if not healthy:
            raise NoHealthyWorker(model)
        least = min(w.in_flight for w in healthy)
        return self.random.choice([w for w in healthy if w.in_flight == least])

    async def dp_size(self, worker: Worker) -> int:
        """The prefill engine's DP size, asked once of its bootstrap server; 1 while it
        cannot say (asked again after `DP_SIZE_RETRY_SECONDS`, so an unreachable bootstrap
        port costs one request the wait, not every one)."""
        known = self.dp_sizes.get(worker.name)
        if known is not None:
            return known
        now = time.monotonic()
        if self.dp_size_retry.get(worker.name, 0.0) > now:
            return 1
        size: int | None = None
        session = self.session()
        port = worker.bootstrap_port or disaggregation.DEFAULT_BOOTSTRAP_PORT
        host = f"[{worker.host}]" if ":" in worker.host else worker.host
        if session is not None:
            try:
                async with asyncio.timeout(DP_SIZE_TIMEOUT_SECONDS):
                    url = f"http://{host}:{port}/route"
                    async with session.get(url, params=ROUTE_INFO_QUERY) as resp:
                        if resp.status == 200:
                            size = max(1, int(orjson.loads(await resp.read()).get("dp_size", 1)))
            except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError) as err:
                log.info("bootstrap server of %s did not tell its DP size: %s", worker.name, err)
        if size is None:  # not registered yet, or unreachable: DP rank 0 meanwhile
            if len(self.dp_size_retry) >= MAX_DP_SIZE_ENTRIES:
                self.dp_size_retry.clear()
            self.dp_size_retry[worker.name] = now + DP_SIZE_RETRY_SECONDS
            return 1
        if len(self.dp_sizes) >= MAX_DP_SIZE_ENTRIES:
            self.dp_sizes.clear()
        self.dp_sizes[worker.name] = size
        return size

    @staticmethod
    def rank_for(
        route_request: RouteRequest, dp_size: int, rank_depths: Sequence[tuple[int, int]] = ()
    ) -> int:
        """The DP rank a prompt goes to: the rank whose KV events show it holding the longest
        prefix of the prompt (``rank_depths``: (rank, leading blocks held), the index's
        per-rank streams), else the prompt's first-page hash, so a conversation's turns (same
        beginning) land on one rank even before its events arrive. Among ranks holding
        equally much, the hash's rank if it is one of them."""
        if dp_size <= 1:
            return 0
        tokens = route_request.token_ids
        if tokens:
            head = orjson.dumps(list(tokens[:64]))
        else:
            head = route_request.text[:256].encode("utf-8", "surrogatepass")
        hashed = zlib.crc32(head) % dp_size
        held = [(depth, rank) for rank, depth in rank_depths if 0 <= rank < dp_size and depth]
        if not held:
            return hashed
        deepest = max(depth for depth, _ in held)
        ranks = [rank for depth, rank in held if depth == deepest]
        return hashed if hashed in ranks else min(ranks)

    def rank_depths(self, decision: Decision[Worker]) -> list[tuple[int, int]]:
        """How much of the prompt each DP rank of the decision's prefill worker holds, from
        the policy's index (empty when the policy keeps none or gave no keys)."""
        index = self.fwd.policy.block_index
        if index is None or not decision.block_keys:
            return []
        return index.rank_depths(decision.worker.name, decision.block_keys)

    # ------------------------------------------------------------------ one request

    async def forward(self, routed: Routed, admitted: Admitted, how: str) -> bool:
        """Serve ``routed`` on prefill/decode pairs of the workers serving its model: the
        pipeline's selection and relay for a pair (`select`, `relay`), again on a new pair
        for a retry; False (nothing sent) when no pair is healthy, so the caller tries the
        colocated workers."""
        fwd = self.fwd
        route_request = admitted.route_request
        prefill, decode = self.split(admitted.served.workers)
        retries = 0
        tried: set[str] = set()
        try:
            while True:
                try:
                    p_decision, d_worker = self.select(admitted, prefill, decode, tried)
                except NoHealthyWorker as none:
                    if retries:
                        self._unavailable(routed, f"{none} is left to retry on")
                        return True
                    return False
                if not retries:
                    self.metrics.pd_requests.labels(how).inc()
                failed = await self.relay(routed, route_request, p_decision, d_worker, retries)
                if failed is None:
                    return True
                # a new pair: which leg reports a failure first can be a race of the two
                # engines' timers (a bootstrap timeout), so neither worker is asked again
                # while others are left; the blame (outlier ejection) stays with the leg
                tried.update((p_decision.worker.name, d_worker.name))
                if failed.answered:
                    return True
                if not retries:
                    fwd.budget.active += 1
                retries += 1
                self.metrics.retries.labels(routed.route).inc()
        finally:
            if retries:
                fwd.budget.active -= 1

    def select(
        self,
        admitted: Admitted,
        prefill: Sequence[Worker],
        decode: Sequence[Worker],
        tried: set[str],
    ) -> tuple[Decision[Worker], Worker]:
        """The pipeline's selection for a pair: the prefill by the policy (`Pipeline.select`)
        among those with a decode they can pair with (`pairs`), then the decode; workers of
        a failed pair are not asked again while others are left. A first try looks among an
        adapter's warm replicas first (`AdapterAffinity`), a retry among all. Raises
        `NoHealthyWorker` naming the leg no worker is left for."""
        pipeline = self.fwd.pipeline
        p_pool = [w for w in prefill if w.name not in tried] or prefill
        d_pool = [w for w in decode if w.name not in tried] or decode
        p_first = pairable(p_pool, d_pool)
        if not tried:
            p_first = pipeline.first_choices(admitted, p_first)
        try:
            p_decision = pipeline.select(admitted, p_first)
        except NoHealthyWorker:
            raise NoHealthyWorker("no healthy prefill worker") from None
        d_first = [w for w in d_pool if pairs(p_decision.worker, w)]
        if not tried:
            d_first = pipeline.first_choices(admitted, d_first)
        try:
            d_worker = self._choose_decode(d_first, admitted.parsed.model)
        except NoHealthyWorker:
            self.fwd.policy.on_request_done(p_decision, False)
            raise NoHealthyWorker("no healthy decode worker") from None
        adapter = admitted.served.adapter
        if adapter is not None:
            pipeline.affinity.routed(adapter, p_decision.worker.name)
            pipeline.affinity.routed(adapter, d_worker.name)
        if self.fwd.peers is not None:  # the peers count it on the prefill, as a choice
            self.fwd.peers.routed(p_decision)
        return p_decision, d_worker

    def _may_retry(self, retries: int, failed: LegFailed) -> bool:
        fwd = self.fwd
        if retries >= fwd.max_retries:
            return False
        if failed.status is not None and failed.status not in RETRYABLE_STATUSES:
            return False  # the request itself is refused (400, 404, ...): answered as it is
        if failed.kind == "transport" or _prefill_broke(failed):
            return True  # a worker is gone: the retry costs it nothing twice
        return fwd.budget.allows(fwd.in_flight, False)

    async def relay(
        self,
        routed: Routed,
        route_request: RouteRequest,
        p_decision: Decision[Worker],
        d_worker: Worker,
        attempt: int,
    ) -> LegFailed | None:
        """One try on a pair; None when the client was answered (whatever the answer). A
        retry is named by a fresh rid: an abort of the try before it (on a worker this one
        may use again) must not stop it."""
        fwd = self.fwd
        p_worker = p_decision.worker
        parsed = routed.parsed
        model = parsed.model or (d_worker.models[0] if d_worker.models else "")
        head, _, body = routed.forwarded.partition(b"\r\n\r\n")
        data = orjson.loads(body)
        named = _Named(routed.rid, routed.restorer)
        if attempt and named.rid is not None:
            fresh = new_rid()
            data["rid"] = fresh
            named = _Named(fresh, None)
            if routed.restorer is not None:
                theirs = client_rid(orjson.loads(routed.request.body)).value
                if isinstance(theirs, str):
                    named = _Named(fresh, Restorer([(fresh, theirs)]))
        dp_size = await self.dp_size(p_worker)
        rank = self.rank_for(route_request, dp_size, self.rank_depths(p_decision))
        room = disaggregation.room_for_rank(rank, self.dp_sizes.get(p_worker.name, 1))
        data.update(
            disaggregation.bootstrap_fields(
                p_worker.host, p_worker.bootstrap_port, room, _batch(routed.route, data)
            )
        )
        prefill_data = dict(data, stream=False)
        prefill_data.pop("stream_options", None)

        def payload(worker: Worker, obj: dict[str, Any]) -> bytes:
            framed = forwarded_headers(routed.request, orjson.dumps(obj), fwd._not_forwarded)
            return upstream_request(routed.request, worker.pool.host_header, framed)

        del head
        handoff = self.settings.handoff_timeout_seconds
        first_byte = min(
            handoff,
            fwd.first_byte.seconds(
                parsed.prompt_tokens, parsed.max_new_tokens, parsed.stream, d_worker.in_flight
            ),
        )
        started = time.monotonic()
        decode_alive = liveness(d_worker) if fwd.config.health_check_interval_seconds > 0 else None
        p_worker.in_flight += 1
        d_worker.in_flight += 1
        p_task = asyncio.ensure_future(
            self._prefill_leg(p_worker, payload(p_worker, prefill_data), routed.since, first_byte)
        )
        d_conn: UpstreamConnection | None = None
        answered = False
        succeeded = False
        failed: LegFailed | None = None
        abandoned = "gave_up"
        try:
            d_task = asyncio.ensure_future(
                self._open(d_worker, payload(d_worker, data), routed.since, first_byte)
            )
            try:
                d_conn, first = await self._decode_head(d_task, p_task, parsed.stream, decode_alive)
            except LegFailed as err:
                failed = err
                return err
            ttft = time.monotonic() - started
            self.metrics.pd_ttft.labels(model).observe(ttft)
            fwd.ledger.first_byte(
                p_decision, model, routed.request.arrived if parsed.stream else None
            )
            if parsed.stream:
                answered = True
                succeeded = await self._relay_stream(routed, named, d_worker, d_conn, first, model)
            else:
                whole = first + await d_conn.read_all()
                if data.get("return_logprob") and routed.route == "/generate":
                    whole = await self._merge_logprobs(whole, p_task)
                answered = True
                succeeded = self._relay_whole(routed, named, d_worker, d_conn, whole, model)
            return None
        except UpstreamError as err:  # reading the decode's whole answer failed
            failed = LegFailed(DECODE, "transport", err.detail)
            return failed
        except asyncio.CancelledError:  # the client left (nothing was counted yet): its
            abandoned = CLIENT_GONE.abandoned
            fwd.ledger.account(routed, d_worker.name, model, CLIENT_GONE)
            raise
        finally:
            self._end_pair(
                named, p_decision, d_worker, p_task, d_conn, failed, succeeded, answered,
                abandoned,
            )  # fmt: skip
            if failed is not None and not self._may_retry(attempt, failed):
                self._answer_failure(routed, named, failed, p_worker, d_worker, model)
                failed.answered = True

    async def _open(
        self, worker: Worker, payload: bytes, since: float, first_byte: float
    ) -> UpstreamConnection:
        pool: UpstreamPool = worker.pool
        return await pool.open(lambda conn: self.fwd._send(conn, payload, since, first_byte))

    async def _prefill_leg(
        self, worker: Worker, payload: bytes, since: float, first_byte: float
    ) -> bytes:
        """The prefill's whole answer; LegFailed when it fails or is not 2xx."""
        started = time.monotonic()
        try:
            conn = await self._open(worker, payload, since, first_byte)
        except UpstreamError as err:
            kind = (
                "timeout"
                if err.reason in ("first_byte_timeout", "request_timeout")
                else ("transport")
            )
            raise LegFailed(PREFILL, kind, err.detail) from None
        try:
            body = await conn.read_all()
        except UpstreamError as err:
            raise LegFailed(PREFILL, "transport", err.detail) from None
        finally:
            worker.pool.release(conn)
        if conn.status >= 300:
            failure = LegFailed(
                PREFILL, _failure_kind(body), f"answered {conn.status}", status=conn.status
            )
            failure.body, failure.headers = body, conn.headers
            raise failure
        self.metrics.pd_prefill.labels().observe(time.monotonic() - started)
        transfer = _transfer_seconds(body)
        if transfer is not None:
            self.metrics.pd_kv_transfer.labels().observe(transfer)
        return body

    async def _decode_head(
        self,
        d_task: asyncio.Future[UpstreamConnection],
        p_task: asyncio.Future[bytes],
        stream: bool,
        decode_alive: Callable[[], bool | None] | None = None,
    ) -> tuple[UpstreamConnection, bytes]:
        """The decode's connection once its answer is committed: its head and, for a stream,
        its first body chunk (returned). A prefill failure before then fails the pair; so
        does a decode that timed out waiting for KV the prefill never sent (`_kv_never_came`:
        the prefill had not answered, and the decode's health probes did not fail)."""
        try:
            legs: set[asyncio.Future[Any]] = {d_task, p_task}
            await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
            if p_task.done() and p_task.exception() is not None and not d_task.done():
                raise _exception(p_task)
            try:
                conn = await d_task
            except UpstreamError as err:
                kind = (
                    "timeout"
                    if err.reason in ("first_byte_timeout", "request_timeout")
                    else ("transport")
                )
                if _kv_never_came(err, p_task, decode_alive):
                    raise _no_kv(err) from None
                raise LegFailed(DECODE, kind, err.detail) from None
        except BaseException:
            if not d_task.done():
                d_task.cancel()
            elif not d_task.cancelled() and d_task.exception() is None:
                d_task.result().close()
            raise
        if conn.status >= 300:
            try:
                body = await conn.read_all()
            except UpstreamError:
                body = b""
            conn.close()
            # the KV never came: the prefill's failure, as its own leg's answer says
            kind = _failure_kind(body)
            leg = PREFILL if kind in ("bootstrap", "transfer") else DECODE
            failure = LegFailed(leg, kind, f"decode answered {conn.status}", status=conn.status)
            failure.body, failure.headers = body, conn.headers
            raise failure
        if not stream:
            return conn, b""
        read = asyncio.ensure_future(conn.read())
        try:
            first: set[asyncio.Future[Any]] = {read, p_task}
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if not read.done() and p_task.exception() is not None:  # p_task is done
                raise _exception(p_task)
            try:
                return conn, await read
            except UpstreamError as err:
                if _kv_never_came(err, p_task, decode_alive):
                    raise _no_kv(err) from None
                raise LegFailed(DECODE, "transport", err.detail) from None
        except BaseException:
            if not read.done():
                read.cancel()
            conn.close()
            raise

    async def _merge_logprobs(self, body: bytes, p_task: asyncio.Future[bytes]) -> bytes:
        """The decode's answer with the prefill's ``input_token_logprobs`` (what SGLang's
        router merges when ``return_logprob`` is set)."""
        try:
            prefill = orjson.loads(await p_task)
            answer = orjson.loads(body)
            ours, theirs = answer.get("meta_info"), prefill.get("meta_info")
            if isinstance(ours, dict) and isinstance(theirs, dict):
                for key in ("input_token_logprobs", "input_top_logprobs"):
                    if key in theirs:
                        ours[key] = theirs[key]
            return orjson.dumps(answer)
        except (LegFailed, orjson.JSONDecodeError, AttributeError):
            return body

    def _relay_whole(
        self,
        routed: Routed,
        named: _Named,
        worker: Worker,
        conn: UpstreamConnection,
        body: bytes,
        model: str,
    ) -> bool:

        status = conn.status
        usage = usage_from_body(body) if status == 200 else None
        if named.restorer is not None:
            body = named.restorer.whole(body)
        routed.request.respond(status, response_headers(conn.headers), body)
        self._count(routed, worker, model, str(status), status < 400, usage)
        return status < 400

    async def _relay_stream(
        self,
        routed: Routed,
        named: _Named,
        worker: Worker,
        conn: UpstreamConnection,
        first: bytes,
        model: str,
    ) -> bool:

        request = routed.request
        restorer = named.restorer
        request.start_chunked(conn.status, response_headers(conn.headers))
        conn.watch_progress()
        before, last = b"", first
        request.write_chunk(first if restorer is None else restorer.chunk(first))
        try:
            while True:
                data = await conn.read()
                if not data:
                    break
                request.write_chunk(data if restorer is None else restorer.chunk(data))
                before, last = last, data
                if request.write_paused:
                    await request.drain()
        except UpstreamError as err:
            self.fwd.ledger.worker_failed(worker, err.reason)
            self.metrics.pd_failures.labels(DECODE, "transport").inc()
            if restorer is not None:
                request.write_chunk(restorer.rest())
            request.write_chunk(sse_error_event(f"the worker's stream broke: {err.detail}"))
            request.end_chunked(keep_alive=False)
            self._count(routed, worker, model, STREAM_ERROR, False, None, before + last)
            return False
        except asyncio.CancelledError:  # the client left: what it was sent settles its cost
            if routed.spend is not None:
                routed.spend.stream_tail = before + last
            raise
        if restorer is not None:
            request.write_chunk(restorer.rest())
        request.end_chunked()
        usage = usage_from_stream_tail(before + last) if conn.status == 200 else None
        self._count(routed, worker, model, str(conn.status), conn.status < 400, usage)
        return conn.status < 400

    def _count(
        self,
        routed: Routed,
        worker: Worker,
        model: str,
        status: str,
        succeeded: bool,
        usage: Any,
        tail: bytes = b"",
    ) -> None:
        """An answered pair, in the ledger every mode shares (`Ledger.account`), on its
        decode worker; ``tail`` is the end of a stream that broke."""

        if tail and routed.spend is not None:
            routed.spend.stream_tail = tail
        relayed = status != STREAM_ERROR
        outcome = TryOutcome(status=status, succeeded=succeeded, relayed=relayed, usage=usage)
        self.fwd.ledger.account(routed, worker.name, model, outcome)

    def _end_pair(
        self,
        named: _Named,
        p_decision: Decision[Worker],
        d_worker: Worker,
        p_task: asyncio.Future[bytes],
        d_conn: UpstreamConnection | None,
        failed: LegFailed | None,
        succeeded: bool,
        answered: bool,
        abandoned: str,
    ) -> None:
        """Account for a pair, however it ended: the leg that failed counts against its
        worker only; a leg still running is ended (its connection closed, its engine asked
        to abort the rid, for the reason ``abandoned``), so no engine is left waiting for a
        partner that is gone."""
        fwd = self.fwd
        p_worker = p_decision.worker
        rid = named.rid
        prefill_ok = p_task.done() and not p_task.cancelled() and p_task.exception() is None
        if not p_task.done():
            p_task.cancel()
            if rid is not None:
                fwd.aborter.abort(p_worker.name, rid, abandoned)
        elif not p_task.cancelled():
            p_task.exception()  # retrieved: its failure is accounted below
        if d_conn is not None:
            if not d_conn.done and rid is not None:
                fwd.aborter.abort(d_worker.name, rid, abandoned)
            d_worker.pool.release(d_conn)
        elif not answered and rid is not None:
            fwd.aborter.abort(d_worker.name, rid, abandoned)
        if failed is not None:
            self.metrics.pd_failures.labels(failed.leg, failed.kind).inc()
            culprit = p_worker if failed.leg == PREFILL else d_worker
            if failed.kind in ("transport", "timeout") or (failed.status or 0) >= 500:
                fwd.ledger.worker_failed(culprit, _reason(failed))
            if failed.leg == DECODE and prefill_ok:
                fwd.outliers.succeeded(p_worker)
        elif answered and abandoned != "client_gone":  # a client leaving says nothing of them
            if prefill_ok:
                fwd.outliers.succeeded(p_worker)
            fwd.outliers.succeeded(d_worker)
        p_worker.in_flight -= 1
        d_worker.in_flight -= 1
        fwd.ledger.ended(p_decision, prefill_ok or succeeded)

    def _answer_failure(
        self,
        routed: Routed,
        named: _Named,
        failed: LegFailed,
        p_worker: Worker,
        d_worker: Worker,
        model: str,
    ) -> None:
        """No retry is left: the client gets the failing leg's answer, or 502/504."""

        worker = p_worker if failed.leg == PREFILL else d_worker
        if failed.status is not None:
            body = failed.body
            if named.restorer is not None:
                body = named.restorer.whole(body)
            routed.request.respond(failed.status, response_headers(failed.headers), body)
            status = str(failed.status)
        else:
            code = 504 if failed.kind == "timeout" else 502
            message = f"{failed.leg} worker failed: {failed.detail}"
            reply_error(routed.request, ClientError(code, message, error_type="upstream_error"))
            status = str(code)
        self._count(routed, worker, model, status, False, None)

    def _unavailable(self, routed: Routed, message: str) -> None:
        reply_error(routed.request, unavailable(message))
        self.fwd.ledger.refused(routed.route, routed.parsed.model, 503)


def pairs(prefill: Worker, decode: Worker) -> bool:
    """Whether the two engines can pair: their pairing contracts (the operator's
    ``serving.tpuserve.dev/pd-contract`` label: image, model, transfer backend, page size, KV
    dtype) are equal, or one is unknown (``--prefill``/``--decode`` flags). During a rollout
    that changes the contract, old prefills pair with old decodes and new with new."""
    return prefill.pd_contract is None or decode.pd_contract in (None, prefill.pd_contract)


def pairable(prefill: Sequence[Worker], decode: Sequence[Worker]) -> list[Worker]:
    """The healthy prefill workers with at least one healthy decode worker to pair with."""
    healthy = [d for d in decode if d.healthy]
    return [p for p in prefill if p.healthy and any(pairs(p, d) for d in healthy)]


def _exception(task: asyncio.Future[Any]) -> BaseException:
    err = task.exception()
    assert err is not None
    return err


def _kv_never_came(
    err: UpstreamError,
    p_task: asyncio.Future[bytes],
    decode_alive: Callable[[], bool | None] | None,
) -> bool:
    """Whether a decode that timed out before its first token waited for KV that never came:
    its prefill had not answered (SGLang's prefill answers once its KV is sent) and the
    decode itself showed no sign of hanging (its health probes did not fail since the pair
    began; with health checks off, nothing says so). Which leg's timer fires first is a race
    between equal deadlines; this does not depend on it (issue 57, item 9)."""
    if err.reason not in ("first_byte_timeout", "request_timeout"):
        return False
    if p_task.done() and not p_task.cancelled() and p_task.exception() is None:
        return False  # the prefill sent its KV: the decode's own failure
    return decode_alive is None or decode_alive() is not False


def _no_kv(err: UpstreamError) -> LegFailed:
    return LegFailed(PREFILL, "timeout", f"the decode got no KV from the prefill ({err.detail})")


def _prefill_broke(failed: LegFailed) -> bool:
    """Whether the KV never came because the prefill broke, not because it was slow: a
    bootstrap or transfer failure that is no timeout (SGLang's and the twin's timeouts say
    "timed out"), such as a prefill that died mid-transfer or is no longer reachable ("the
    prefill is gone", "Cannot connect to host"). Which leg reports a dead prefill first is a
    race (its own connection reset, or the decode's failed transfer); either way the retry is
    not the retry budget's to refuse: a dead worker's requests all fail at once, and the
    budget, meant to keep retries from piling onto an overloaded fleet, would fail most."""
    if failed.leg != PREFILL or failed.kind not in ("bootstrap", "transfer"):
        return False
    return b"timed out" not in failed.body[:2000].lower()


def _reason(failed: LegFailed) -> str:
    """The ``tpuserve_router_upstream_errors_total`` reason of a leg's failure."""
    if failed.kind == "timeout":
        return "first_byte_timeout"
    if failed.kind == "transport":
        return "reset_before_response"
    return "retryable_status"


def _batch(route: str, data: dict[str, Any]) -> int | None:
    """How many prompts a batched ``/generate`` carries (None: one prompt)."""
    if route != "/generate":
        return None
    text, ids = data.get("text"), data.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def _transfer_seconds(body: bytes) -> float | None:
    """Seconds between a prefill engine's first token and its answer (bootstrap wait and KV
    send), from its ``/generate`` answer's meta_info; None when it does not say."""
    try:
        meta = orjson.loads(body).get("meta_info")
        sent, done = meta["response_sent_to_client_ts"], meta["prefill_finished_time"]
        return max(0.0, float(sent) - float(done))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return None
