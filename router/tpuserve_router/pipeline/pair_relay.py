"""The relay stage for a prefill/decode pair (`tpuserve_router.pipeline.selection.Pair`), as
SGLang's PD contract asks (`sglang_tpu.disaggregation`): the same request goes to the prefill
engine and the decode engine concurrently, with ``bootstrap_host`` (the prefill's host),
``bootstrap_port`` (its bootstrap server) and ``bootstrap_room`` (a random 63-bit integer;
lists, rooms ``room + i``, for a batched ``/generate``). The decode engine bootstraps with the
prefill, receives the prompt's KV and streams the answer, which is what the client gets; the
prefill's answer is drained, and its ``input_token_logprobs`` are merged into a non-streamed
``/generate`` answer only when the request asked for ``return_logprob``.

**The prefill's DP rank**: SGLang serves a room on rank ``room % dp_size``, so the relay draws
the room for a rank of its choosing: the rank whose KV events show it holding the longest
prefix of the prompt, else the rank the prompt's first page hashes to, so every turn of a
conversation lands on the rank whose radix tree holds its prefix. ``dp_size`` is read once
from the prefill's bootstrap server (``GET /route`` with -1 ranks).

Failures: a transport error or a non-2xx answer on either leg ends the other (its connection
closed, the engine asked to abort the request's rid); nothing has reached the client yet, so
the driver's retry rule may send the request to a new pair with a new room (a worker that is
gone, or a prefill that broke a handoff other than by a timeout, is retried without asking
the budget: a dead prefill fails all its pairs at once). Each leg counts against its own
worker's outlier record; a decode that fails because the KV never came (a bootstrap or
transfer failure, or the router's timeout on it while the prefill had not answered and the
decode's probes did not fail) counts against the prefill. The router never waits for a leg
longer than ``--pd-handoff-timeout-seconds``, at most the engines' own
``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` and ``..._WAITING_TIMEOUT`` (300 s each by
default), so it gives up (and aborts both legs) no later than they would; a prefill that
answers nothing by its floor while no health probe of it passed fails there, as a hung
worker does on the HTTP port (`relay.liveness`). A stream is committed to the client at the
decode's first body chunk; a failure after it ends the stream with an SSE error event, as on
one worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import aiohttp
import orjson

from sglang_tpu import disaggregation
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError, UpstreamPool
from tpuserve_router.engines.worker_session import WorkerSession
from tpuserve_router.engines.workers import Worker
from tpuserve_router.pipeline.cancellation import Aborter
from tpuserve_router.pipeline.client import sse_error_event
from tpuserve_router.pipeline.framing import forwarded_headers, response_headers, upstream_request
from tpuserve_router.pipeline.ledger import (
    CLIENT_GONE,
    STREAM_ERROR,
    UNFINISHED,
    Ledger,
    TryOutcome,
    Verdict,
)
from tpuserve_router.pipeline.migration import Continuation, Kept
from tpuserve_router.pipeline.pd_settings import DECODE, PREFILL, PdSettings
from tpuserve_router.pipeline.relay import (
    Retry,
    Routed,
    SingleRelay,
    Tried,
    answer_error,
    liveness,
)
from tpuserve_router.pipeline.request_body import ClientError
from tpuserve_router.pipeline.request_ids import Restorer, client_rid, new_rid
from tpuserve_router.pipeline.retry import RETRY, RETRYABLE_STATUSES
from tpuserve_router.pipeline.selection import Pair
from tpuserve_router.pipeline.usage import usage_from_body, usage_from_stream_tail
from tpuserve_router.policies.base import Decision, Policy, RouteRequest

log = logging.getLogger(__name__)

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
        self.silent = False
        """The prefill answered neither the request by its floor nor a health probe since
        (`relay.liveness`): hung, so its retry spends no budget, as a hung worker's on HTTP."""


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


class PairRelay:
    """One try on a prefill/decode pair; one per router in PD mode."""

    def __init__(
        self,
        single: SingleRelay,
        settings: PdSettings,
        policy: Policy,
        session: Callable[[], WorkerSession | None],
    ) -> None:
        self.single = single
        self.ledger: Ledger = single.ledger
        self.aborter: Aborter = single.aborter
        self.settings = settings
        self.policy = policy
        self.session = session
        self.dp_sizes: dict[str, int] = {}  # prefill worker -> its DP size
        self.dp_size_retry: dict[str, float] = {}  # prefill worker -> when to ask again

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
        index = self.policy.block_index
        if index is None or not decision.block_keys:
            return []
        return index.rank_depths(decision.worker.name, decision.block_keys)

    # ------------------------------------------------------------------ one try

    async def relay(
        self, routed: Routed, pair: Pair, retry: Retry, tried: Tried, attempt: int
    ) -> None:
        """One try on a pair (its workers counted in flight already, `Ledger.started`),
        after ``attempt`` earlier ones; how it ended is left in ``tried``. A retry is named by
        a fresh rid: an abort of the try before it (on a worker this one may use again) must
        not stop it."""
        p_decision = pair.prefill
        p_worker, d_worker = p_decision.worker, pair.decode
        parsed = routed.parsed
        model = parsed.model or (d_worker.models[0] if d_worker.models else "")
        data = orjson.loads(routed.body)
        named = _Named(routed.rid, routed.restorer)
        if attempt and named.rid is not None and routed.continuation is None:
            fresh = new_rid()
            data["rid"] = fresh
            named = _Named(fresh, None)
            if routed.restorer is not None:
                theirs = client_rid(orjson.loads(routed.request.body)).value
                if isinstance(theirs, str):
                    named = _Named(fresh, Restorer([(fresh, theirs)]))
        dp_size = await self.dp_size(p_worker)
        rank = self.rank_for(
            RouteRequest(parsed.model, parsed.text, parsed.token_ids),
            dp_size,
            self.rank_depths(p_decision),
        )
        room = disaggregation.room_for_rank(rank, self.dp_sizes.get(p_worker.name, 1))
        data.update(
            disaggregation.bootstrap_fields(
                p_worker.host, p_worker.bootstrap_port, room, _batch(routed.route, data)
            )
        )
        prefill_data = dict(data, stream=False)
        prefill_data.pop("stream_options", None)

        def payload(worker: Worker, obj: dict[str, Any]) -> bytes:
            framed = forwarded_headers(routed.request, orjson.dumps(obj), routed.dropped)
            return upstream_request(routed.request, worker.pool.host_header, framed)

        budget = self.single.first_byte
        probes = self.single.probes
        first_byte = min(
            self.settings.handoff_timeout_seconds,
            budget.seconds(
                parsed.prompt_tokens, parsed.max_new_tokens, parsed.stream, d_worker.in_flight - 1
            ),
        )
        p_alive = None
        if probes:  # a hung prefill fails at its floor, as a hung worker does on HTTP
            floor = budget.alive_seconds(parsed.prompt_tokens, p_worker.in_flight - 1)
            p_alive = (min(first_byte, floor), liveness(p_worker))
        started = time.monotonic()
        decode_alive = liveness(d_worker) if probes else None
        p_task = asyncio.ensure_future(
            self._prefill_leg(
                p_worker, payload(p_worker, prefill_data), routed.since, first_byte, p_alive
            )
        )
        d_conn: UpstreamConnection | None = None
        answered = False
        failed: LegFailed | None = None
        abandoned = "gave_up"
        outcome = UNFINISHED
        try:
            d_task = asyncio.ensure_future(
                self._open(d_worker, payload(d_worker, data), routed.since, first_byte)
            )
            try:
                d_conn, first = await self._decode_head(d_task, p_task, parsed.stream, decode_alive)
            except LegFailed as err:
                failed = err
                return
            if routed.continuation is None:
                arrived = routed.request.arrived if parsed.stream else None
                self.ledger.pair_first_byte(p_decision, model, time.monotonic() - started, arrived)
            else:  # a moved stream's: its first byte was the first engine's
                self.ledger.first_byte(p_decision, model, None)
            answered = True
            if parsed.stream:
                outcome = await self._relay_stream(routed, named, d_worker, d_conn, first, tried)
            else:
                whole = first + await d_conn.read_all()
                if data.get("return_logprob") and routed.route == "/generate":
                    whole = await self._merge_logprobs(whole, p_task)
                outcome = self._relay_whole(routed, named, d_conn, whole)
        except UpstreamError as err:  # reading the decode's whole answer failed
            answered = False
            failed = LegFailed(DECODE, "transport", err.detail)
        except asyncio.CancelledError:  # the client left
            abandoned = CLIENT_GONE.abandoned
            outcome = CLIENT_GONE
            raise
        finally:
            verdicts, prefill_ok = self._end_pair(
                named, pair, p_task, d_conn, failed, answered, abandoned, outcome
            )
            leg = outcome.leg_failure
            if failed is not None:
                leg = (failed.leg, failed.kind)
                retryable = failed.status is None or failed.status in RETRYABLE_STATUSES
                free = failed.kind == "transport" or failed.silent or _prefill_broke(failed)
                if retry(retryable, free):
                    outcome = TryOutcome(RETRY)
                else:
                    outcome = self._answer_failure(routed, named, failed)
            tried.outcome = replace(
                outcome,
                verdicts=(*outcome.verdicts, *verdicts),
                leg_failure=leg,
                policy_ok=prefill_ok or outcome.succeeded,
            )

    async def _open(
        self,
        worker: Worker,
        payload: bytes,
        since: float,
        first_byte: float,
        alive: tuple[float, Callable[[], bool | None]] | None = None,
    ) -> UpstreamConnection:
        pool: UpstreamPool = worker.pool
        return await pool.open(
            lambda conn: self.single.send(conn, payload, since, first_byte, alive)
        )

    async def _prefill_leg(
        self,
        worker: Worker,
        payload: bytes,
        since: float,
        first_byte: float,
        alive: tuple[float, Callable[[], bool | None]] | None = None,
    ) -> bytes:
        """The prefill's whole answer; LegFailed when it fails or is not 2xx."""
        started = time.monotonic()
        try:
            conn = await self._open(worker, payload, since, first_byte, alive)
        except UpstreamError as err:
            kind = (
                "timeout"
                if err.reason in ("first_byte_timeout", "request_timeout")
                else ("transport")
            )
            failure = LegFailed(PREFILL, kind, err.detail)
            failure.silent = err.silent
            raise failure from None
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
        self.ledger.prefilled(time.monotonic() - started, _transfer_seconds(body))
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
        self, routed: Routed, named: _Named, conn: UpstreamConnection, body: bytes
    ) -> TryOutcome:
        status = conn.status
        usage = usage_from_body(body) if status == 200 else None
        if named.restorer is not None:
            body = named.restorer.whole(body)
        routed.request.respond(status, response_headers(conn.headers), body)
        return TryOutcome(status=str(status), succeeded=status < 400, relayed=True, usage=usage)

    async def _relay_stream(
        self,
        routed: Routed,
        named: _Named,
        worker: Worker,
        conn: UpstreamConnection,
        first: bytes,
        tried: Tried,
    ) -> TryOutcome:
        request = routed.request
        restorer = named.restorer
        continued = routed.continuation
        rejoin = None
        if continued is None:
            request.start_chunked(conn.status, response_headers(conn.headers))
        else:
            rejoin = continued.rejoin()
        conn.watch_progress()
        kept = Kept(routed.route) if not routed.unmigratable else None
        before, last = b"", first
        data = first
        try:
            while data:
                if kept is not None:
                    kept.add(data)
                if rejoin is not None:
                    data = rejoin.feed(data)
                request.write_chunk(data if restorer is None else restorer.chunk(data))
                if data:
                    before, last = last, data
                if request.write_paused:
                    await request.drain()
                data = await conn.read()
        except UpstreamError as err:
            if routed.spend is not None:
                routed.spend.stream_tail = before + last
            verdicts = (Verdict(worker, err.reason),)
            moved = self.single.migrate(routed, err, kept, tried, rejoin)
            if isinstance(moved, Continuation):
                return TryOutcome(
                    RETRY, verdicts=verdicts, leg_failure=(DECODE, "transport"),
                    continuation=moved,
                )  # fmt: skip
            if restorer is not None:
                request.write_chunk(restorer.rest())
            why = f"; the stream cannot move to another engine: {moved}" if moved else ""
            request.write_chunk(sse_error_event(f"the worker's stream broke: {err.detail}{why}"))
            request.end_chunked(keep_alive=False)
            return TryOutcome(
                status=STREAM_ERROR,
                verdicts=verdicts,
                leg_failure=(DECODE, "transport"),
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
        status = conn.status
        usage = usage_from_stream_tail(before + last) if status == 200 else None
        return TryOutcome(status=str(status), succeeded=status < 400, relayed=True, usage=usage)

    def _end_pair(
        self,
        named: _Named,
        pair: Pair,
        p_task: asyncio.Future[bytes],
        d_conn: UpstreamConnection | None,
        failed: LegFailed | None,
        answered: bool,
        abandoned: str,
        outcome: TryOutcome,
    ) -> tuple[tuple[Verdict, ...], bool]:
        """End a pair's legs, however it ended: a leg still running is ended (its connection
        closed, its engine asked to abort the rid, for the reason ``abandoned``), so no
        engine is left waiting for a partner that is gone. Returns what it says of each
        worker (a failed leg counts against its own worker only) and whether the prefill
        answered."""
        p_worker, d_worker = pair.prefill.worker, pair.decode
        rid = named.rid
        prefill_ok = p_task.done() and not p_task.cancelled() and p_task.exception() is None
        if not p_task.done():
            p_task.cancel()
            if rid is not None:
                self.aborter.abort(p_worker.name, rid, abandoned)
        elif not p_task.cancelled():
            p_task.exception()  # retrieved: its failure is accounted below
        if d_conn is not None:
            if not d_conn.done and rid is not None:
                self.aborter.abort(d_worker.name, rid, abandoned)
            d_worker.pool.release(d_conn)
        elif not answered and rid is not None:
            self.aborter.abort(d_worker.name, rid, abandoned)
        verdicts: list[Verdict] = []
        if failed is not None:
            culprit = p_worker if failed.leg == PREFILL else d_worker
            if failed.kind in ("transport", "timeout") or (failed.status or 0) >= 500:
                verdicts.append(Verdict(culprit, _reason(failed)))
            if failed.leg == DECODE and prefill_ok:
                verdicts.append(Verdict(p_worker, "", False))
        elif answered and abandoned != CLIENT_GONE.abandoned:  # a client leaving says nothing
            if prefill_ok:
                verdicts.append(Verdict(p_worker, "", False))
            if outcome.status != STREAM_ERROR and outcome.continuation is None:
                # (a broken stream's verdict is the relay's)
                verdicts.append(Verdict(d_worker, "", False))
        return tuple(verdicts), prefill_ok

    def _answer_failure(self, routed: Routed, named: _Named, failed: LegFailed) -> TryOutcome:
        """No retry is left: the client gets the failing leg's answer, or 502/504."""
        if failed.status is not None and routed.continuation is None:
            body = failed.body
            if named.restorer is not None:
                body = named.restorer.whole(body)
            routed.request.respond(failed.status, response_headers(failed.headers), body)
            status = str(failed.status)
        else:
            code = failed.status or (504 if failed.kind == "timeout" else 502)
            message = f"{failed.leg} worker failed: {failed.detail}"
            answer_error(routed, ClientError(code, message, error_type="upstream_error"))
            status = str(code)
        return TryOutcome(status=status, relayed=True)


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
