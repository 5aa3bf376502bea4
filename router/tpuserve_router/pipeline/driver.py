"""The one driver of every request: the pipeline's stages (`tpuserve_router.pipeline.stages`)
in order, whatever the mode.

`Driver.serve` runs a request the router relays itself (the HTTP port, colocated or PD):
**admit**, then the loop **select** (`Selector.select`: a `Single` worker or a `Pair`) ->
**relay** (`SingleRelay` or `PairRelay`) -> **account** (`Ledger.close`), again from
selection while a try that reached the client with nothing may be retried under the one retry
rule (`Driver.may_retry`, `tpuserve_router.pipeline.retry`). `Driver.pick` runs the same
stages for a request whose gateway relays (the endpoint picker): admit, select, and the
ledger when the gateway's answer ends (`Driver.close`).

A refusal of any stage is a `Refused`, which the front answers its own way and the ledger
counts (`Driver.refused`). The router's in-flight count and the retry budget are given back
in a ``finally``, so they return to zero on every path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

from tpuserve_router.core import RouterCore
from tpuserve_router.engines.outliers import OutlierDetector
from tpuserve_router.engines.worker_session import WorkerSession
from tpuserve_router.engines.workers import Worker
from tpuserve_router.pipeline.cancellation import Aborter
from tpuserve_router.pipeline.client import Client, sse_error_event
from tpuserve_router.pipeline.deadlines import first_byte_budget
from tpuserve_router.pipeline.framing import CREDENTIALS, HOP_BY_HOP, forwarded_headers
from tpuserve_router.pipeline.ledger import Bill, Ledger, TryOutcome
from tpuserve_router.pipeline.migration import Encoder, why_not
from tpuserve_router.pipeline.pair_relay import PairRelay
from tpuserve_router.pipeline.pd_settings import pd_settings
from tpuserve_router.pipeline.relay import Routed, SingleRelay, Tried
from tpuserve_router.pipeline.request_body import Tokens
from tpuserve_router.pipeline.request_ids import name_request
from tpuserve_router.pipeline.retry import ANSWERED, RetryBudget, should_retry
from tpuserve_router.pipeline.selection import (
    Disaggregation,
    Pair,
    Route,
    Selection,
    Selector,
    Single,
)
from tpuserve_router.pipeline.stages import Admitted, Arrival, Pipeline, Refused
from tpuserve_router.tenancy.auth import KeyStore
from tpuserve_router.tenancy.hold import HoldQueues
from tpuserve_router.tenancy.quotas import Quotas


class Driver:
    """Runs every request through the stages; one per router."""

    def __init__(
        self,
        pipeline: Pipeline,
        selector: Selector,
        single: SingleRelay,
        pair: PairRelay | None,
        budget: RetryBudget,
        max_retries: int,
        dropped: frozenset[bytes],
        migration_limit: int = 0,
    ) -> None:
        """``dropped``: the client's headers never passed on to a worker; ``migration_limit``:
        the times a stream may move to another engine (`migration`)."""
        self.pipeline = pipeline
        self.ledger: Ledger = pipeline.ledger
        self.selector = selector
        self.single = single
        self.pair = pair
        self.budget = budget
        self.max_retries = max_retries
        self.dropped = dropped
        self.migration_limit = migration_limit

    # ------------------------------------------------------------------ relayed here

    async def serve(self, arrival: Arrival, client: Client) -> None:
        """One request the router relays: admitted, then tried until answered; raises
        `Refused` for the front to answer (the ledger has not counted it: `refused`)."""
        pipeline = self.pipeline
        admitted: Admitted | None = None
        try:
            admitted = await pipeline.admit(arrival)
            client.extra_headers = arrival.reply_headers
            pipeline.enter(admitted)
            await self._tries(admitted, client)
        finally:
            if admitted is not None:
                pipeline.leave(admitted)

    async def _tries(self, admitted: Admitted, client: Client) -> None:
        """Select, relay and account, again on other workers while a try may be retried;
        raises `Refused` (503) when no worker can take it."""
        parsed = admitted.parsed
        ids = name_request(client.body, admitted.theirs, parsed.single)
        theirs = admitted.theirs.value
        routed = Routed(
            client, admitted.route, parsed, forwarded_headers(client, ids.body, self.dropped),
            ids.rid, admitted.key, admitted.since, ids.restorer, admitted.spend, self.dropped,
            self._unmigratable(admitted), theirs if isinstance(theirs, str) else ids.rid,
        )  # fmt: skip
        route = Route()
        pipeline = self.pipeline
        last: Worker | None = None  # the worker of the try before
        moving = False  # the stream moves on: counted once an engine takes it
        try:
            while True:
                try:
                    selection = self.selector.select(admitted, route)
                except Refused as refused:
                    if routed.continuation is None:
                        raise
                    self._unmoved(routed, last, refused.error.message)  # the stream began
                    return
                if moving:
                    self.ledger.migrated(routed.route)
                    moving = False
                pipeline.chosen(admitted, selection)
                outcome = await self._try(routed, selection, route)
                if outcome.attempt is ANSWERED:
                    return
                route.tried.extend(selection.workers)
                last = selection.answering
                moved = outcome.continuation
                if moved is not None:  # the stream goes on from another engine
                    route.migrations += 1
                    moving = True
                    forwarded = forwarded_headers(client, moved.body, self.dropped)
                    restorer = moved.restorer if moved.rid is not None else routed.restorer
                    routed = replace(
                        routed, forwarded=forwarded, rid=moved.rid, restorer=restorer,
                        continuation=moved,
                    )  # fmt: skip
                    continue
                if not route.retries:
                    self.budget.active += 1  # held until the request ends
                route.retries += 1
        finally:
            if route.retries:
                self.budget.active -= 1

    def _unmoved(self, routed: Routed, worker: Worker | None, why: str) -> None:
        """A stream whose engine died found no engine to move to: it ends with an error event
        saying so, counted on the engine it broke on."""
        client = routed.request
        if routed.restorer is not None:
            client.write_chunk(routed.restorer.rest())
        cause = routed.continuation.cause if routed.continuation else "the worker's stream broke"
        message = f"{cause}; the stream cannot move to another engine: {why}"
        client.write_chunk(sse_error_event(message))
        client.end_chunked(keep_alive=False)
        name = worker.name if worker is not None else "none"
        self.ledger.unmoved(routed, name, routed.parsed.model)

    def _unmigratable(self, admitted: Admitted) -> str:
        """Why the request's stream cannot move to another engine ("": it can)."""
        if self.migration_limit <= 0:
            return "--migration-limit is 0"
        parsed = admitted.parsed  # what the body says beyond is read only if the stream breaks
        return why_not(admitted.route, parsed.stream, parsed.single)

    async def _try(self, routed: Routed, selection: Selection, route: Route) -> TryOutcome:
        """One try: relayed, then accounted in the ledger however it ended (the client's
        leaving too)."""
        ledger = self.ledger
        tried = Tried(migrations_left=self.migration_limit - route.migrations)
        answering = selection.answering
        model = routed.parsed.model or (answering.models[0] if answering.models else "")
        retry = functools.partial(self.may_retry, selection, route.retries)
        ledger.started(selection)
        try:
            if isinstance(selection, Single):
                await self.single.relay(routed, selection, retry, tried)
            else:
                assert self.pair is not None, "a pair is selected in PD mode only"
                await self.pair.relay(routed, selection, retry, tried, route.retries)
        finally:
            ledger.close(routed, selection, model, tried.outcome)
        return tried.outcome

    def may_retry(self, selection: Selection, retries: int, retryable: bool, free: bool) -> bool:
        """The one retry rule (`should_retry`) for a try of ``selection`` that failed before
        the client had anything: a ``retryable`` failure goes to another worker (or pair)
        while retries are left and, unless it is ``free`` (the worker is gone or hung), the
        retry budget allows. A worker's retry needs another healthy candidate; a pair's
        looks for a new pair (503 when none is left)."""
        budget = None if free else self.budget
        in_flight = self.pipeline.in_flight
        if isinstance(selection, Pair):
            return (
                retryable
                and retries < self.max_retries
                and (budget is None or budget.allows(in_flight, holding=retries > 0))
            )
        worker = selection.decision.worker
        candidates = selection.candidates
        return should_retry(
            retryable, retries, self.max_retries, worker, candidates, budget, in_flight
        )

    # ------------------------------------------------------------------ relayed by a gateway

    def pick(
        self, arrival: Arrival, narrow: Callable[[Admitted], Sequence[Worker]] | None = None
    ) -> tuple[Admitted, Single]:
        """Admit and select for a request a gateway relays (the picker): one worker, counted
        in flight until `close`; ``narrow`` gives the candidates among those serving its
        model (None: all of them), or raises `Refused`. Raises `Refused`."""
        pipeline = self.pipeline
        admitted = pipeline.admit_now(arrival)
        try:
            candidates = admitted.served.workers if narrow is None else narrow(admitted)
            selection = self.selector.select_single(admitted, candidates)
        except Refused:
            pipeline.leave(admitted)
            raise
        pipeline.chosen(admitted, selection)
        pipeline.enter(admitted)
        self.ledger.started(selection)
        return admitted, selection

    def close(
        self,
        bill: Bill,
        admitted: Admitted,
        selection: Single,
        served: Worker,
        model: str,
        outcome: TryOutcome,
    ) -> None:
        """A gateway's answer ended, from ``served`` (the gateway may have gone to another
        endpoint than the one selected): the ledger, and the request out of flight."""
        self.ledger.close(bill, selection, model, outcome, served)
        self.pipeline.leave(admitted)

    def refused(self, route: str, refused: Refused) -> None:
        """A request a stage refused: counted (its status, on worker ``none``)."""
        self.ledger.refused(route, refused.model, refused.error.status)


def make_driver(
    core: RouterCore,
    tokenizer: Tokens | None,
    outliers: OutlierDetector,
    aborter: Aborter,
    holds: HoldQueues,
    *,
    keys: KeyStore | None = None,
    quotas: Quotas | None = None,
    before_decision: Callable[[], None] | None = None,
    on_arrival: Callable[[bool, str], None] | None = None,
    session: Callable[[], WorkerSession | None] = lambda: None,
) -> Driver:
    """The driver and its stages, for one router: with ``keys`` (the router's own API keys) a
    request is admitted by its key and ``quotas``; ``before_decision`` runs before every
    routing decision (the KV events' due read), ``on_arrival`` on every arrival, told whether
    it is held (the demand signal); PD mode (`pd_settings`) when the router has prefill and
    decode workers, whose bootstrap servers are asked through ``session``."""
    config = core.config
    pd = pd_settings(config)
    ledger = Ledger(core, outliers, pd=pd is not None)
    pipeline = Pipeline(
        core, tokenizer, ledger, holds, keys=keys, quotas=quotas,
        before_decision=before_decision, on_arrival=on_arrival,
    )  # fmt: skip
    disaggregation = None if pd is None else Disaggregation(pd, core.policy, config.seed)
    single = SingleRelay(
        config,
        first_byte_budget(config),
        ledger,
        aborter,
        functools.partial(_tokens, tokenizer, config.tokenizer),
    )
    pair = None if pd is None else PairRelay(single, pd, core.policy, session)
    budget = RetryBudget(config.retry_budget_percent, config.retry_budget_min, ledger.retry_denied)
    # With the router's own keys, a client's key is the router's business: not the workers'.
    dropped = HOP_BY_HOP if keys is None else HOP_BY_HOP | CREDENTIALS
    return Driver(
        pipeline, Selector(pipeline, disaggregation), single, pair, budget, config.max_retries,
        dropped, config.migration_limit,
    )  # fmt: skip


@functools.cache
def _loaded(path: str | None) -> Encoder:
    from sglang_tpu.tokenizer import load_tokenizer

    return load_tokenizer(path)


def _tokens(tokenizer: Tokens | None, path: str | None) -> Encoder:
    """The router's tokenizer, else ``--tokenizer``'s, loaded on a first migration."""
    return tokenizer if tokenizer is not None else _loaded(path)
