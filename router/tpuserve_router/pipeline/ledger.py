"""The pipeline's last stage, the one ledger every mode accounts in
(`tpuserve_router.pipeline.stages`).

A try however it ended (a `TryOutcome`: answered, retried, the client gone) on a colocated
worker, a prefill/decode pair or an endpoint the picker chose is accounted here and nowhere
else (`Ledger.close`): its tokens, the request's series (status, end-to-end latency, the
tenant's), how it settles the key's quota (`Spend.charge`), the policy and the peers told it
ended, each worker's outlier record (`OutlierDetector`, from the try's `Verdict`s) and its
requests in flight, a pair's failed leg, a retry. So is a decision acted on (`chosen`:
``tpuserve_router_routing_decisions_total``, a pair's too), a refused request (its status, on
worker ``none``) and the first byte of an answer (the policy's booked prefill released, TTFT).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from tpuserve_router.core import RouterCore
from tpuserve_router.engines.outliers import OutlierDetector
from tpuserve_router.engines.workers import Worker
from tpuserve_router.labels import KV_TIERS, OUTCOMES, PD_FAILURE_KINDS, PD_LEGS, PD_ROUTES
from tpuserve_router.pipeline.migration import Continuation
from tpuserve_router.pipeline.retry import ANSWERED, RETRY, Attempt
from tpuserve_router.pipeline.usage import TokenCounts, usage_from_stream_tail
from tpuserve_router.policies.base import Decision
from tpuserve_router.tenancy.auth import ApiKey
from tpuserve_router.tenancy.quotas import KeyQuota, Reservation

CLIENT_CLOSED: Final = "499"  # nginx's code for "the client went away first"
STREAM_ERROR: Final = "stream_error"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a try says of one of its workers: an upstream error (``reason``, counted in
    ``tpuserve_router_upstream_errors_total``; "": none) and, for its outlier record, a
    failure (``failed`` True), a success (False) or nothing (None)."""

    worker: Worker
    reason: str = ""
    failed: bool | None = True


@dataclass(frozen=True, slots=True)
class TryOutcome:
    """How one try ended: what the ledger accounts for."""

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
    verdicts: tuple[Verdict, ...] = ()
    leg_failure: tuple[str, str] | None = None
    """A pair's failed leg and its kind (``tpuserve_router_pd_failures_total``)."""
    policy_ok: bool | None = None
    """What the policy hears of its decision (None: ``succeeded``; a pair whose prefill
    answered succeeded as a prefill)."""
    continuation: Continuation | None = None
    """Its stream goes on from another engine (`migration`): the request's next try."""
    not_migrated: bool = False
    """Its stream broke where it could have moved, and did not (the error event says why)."""


UNFINISHED: Final = TryOutcome()
"""A try an unexpected error ended: counted as the client's."""
CLIENT_GONE: Final = TryOutcome(abandoned="client_gone")
RETRIED: Final = TryOutcome(RETRY)


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


class Bill(Protocol):
    """Whose tries the ledger accounts: the route the request came by, when it arrived,
    and the API key (and its spend) it is charged to, if any."""

    @property
    def route(self) -> str: ...

    @property
    def arrived(self) -> float: ...

    @property
    def key(self) -> ApiKey | None: ...

    @property
    def spend(self) -> Spend | None: ...


class Selected(Protocol):
    """A selection acted on (`tpuserve_router.pipeline.selection`: a worker or a pair)."""

    @property
    def decision(self) -> Decision[Worker]: ...

    @property
    def workers(self) -> tuple[Worker, ...]: ...

    @property
    def answering(self) -> Worker: ...

    @property
    def how(self) -> str: ...


class Ledger:
    """The one place a request is accounted in, whatever mode served it; one per router."""

    def __init__(self, core: RouterCore, outliers: OutlierDetector, pd: bool = False) -> None:
        """``pd``: PD mode (its series exist at zero from the start)."""
        metrics = core.metrics
        policy = self.policy = core.policy
        self.peers = core.peers
        self.metrics = metrics
        self.outliers = outliers
        # Children whose labels never change, bound once; the others are looked up in their
        # family (the one cache of children) through lookups bound here. On the request path
        # a counter child's ``value`` is added to in place: ``inc`` would be a call a series.
        self.decisions = {o: metrics.decisions.labels(policy.name, o) for o in OUTCOMES}
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
        # Every answer's four token series, by (model, worker): their families' own children
        # (the one cache, not a copy) read first, the lookup (made on first use) only on a miss
        self._token_children = (
            metrics.prompt_tokens.children,
            metrics.completion_tokens.children,
            metrics.cached_tokens.children,
            metrics.predicted_cached_tokens.children,
        )
        self._tenant_requests = metrics.tenant_requests.labels
        self._tenant_tokens = metrics.tenant_tokens.labels
        self._retries = metrics.retries.labels
        self._shed = metrics.shed.labels
        self._auth_failures = metrics.auth_failures.labels
        self._rate_limited = metrics.rate_limited.labels
        self._migrations = metrics.migrations.labels
        self._over_budget = metrics.retries_over_budget.labels()
        self._upstream_errors = metrics.upstream_errors.labels
        self._pd_requests = metrics.pd_requests.labels
        self._pd_failures = metrics.pd_failures.labels
        self._pd_ttft = metrics.pd_ttft.labels
        self._pd_prefill = metrics.pd_prefill.labels()
        self._pd_kv_transfer = metrics.pd_kv_transfer.labels()
        if pd:
            for how in PD_ROUTES:
                self._pd_requests(how)
            for leg in PD_LEGS:
                for kind in PD_FAILURE_KINDS:
                    self._pd_failures(leg, kind)

    def started(self, selection: Selected) -> None:
        """A try of ``selection`` begins: each of its workers has one more in flight."""
        for worker in selection.workers:
            worker.in_flight += 1

    def close(
        self,
        bill: Bill,
        selection: Selected,
        model: str,
        outcome: TryOutcome,
        served: Worker | None = None,
    ) -> None:
        """Everything that happens when a try ends, however it ended, on a worker or a
        pair: what it says of each worker (upstream errors, outlier records), a pair's
        failed leg, the answer accounted (`account`, on the worker that answered), the
        workers' in-flight counts given back, the policy and the peers told, a retry
        counted. ``served``: the worker a gateway sent it to, when not the one selected
        (`counted` moved it there)."""
        for verdict in outcome.verdicts:
            if verdict.reason:
                self._upstream_errors(verdict.worker.name, verdict.reason).inc()
            if verdict.failed:
                self.outliers.failed(verdict.worker)
            elif verdict.failed is not None:
                self.outliers.succeeded(verdict.worker)
        if outcome.leg_failure is not None:
            self._pd_failures(*outcome.leg_failure).inc()
        decision = selection.decision
        workers = selection.workers if served is None else (served,)
        single = len(workers) == 1  # a pair's prediction is not the decode's
        answering = selection.answering if served is None else served
        self.account(bill, answering.name, model, outcome, decision if single else None)
        for worker in workers:
            worker.in_flight -= 1
        ok = outcome.policy_ok
        self.ended(decision, outcome.succeeded if ok is None else ok)
        if outcome.continuation is not None:
            pass  # counted once it found an engine (`migrated`)
        elif outcome.attempt is RETRY:
            self._retries(bill.route).inc()
        elif outcome.not_migrated:
            self._migrations(bill.route, "not_migrated").inc()

    def account(
        self,
        bill: Bill,
        worker: str,
        model: str,
        outcome: TryOutcome,
        decision: Decision[Worker] | None = None,
    ) -> None:
        """The one ledger of a try, on a colocated worker, a prefill/decode pair (``worker``
        its decode) or a picked endpoint: the answer's tokens, how it ended (which settles
        the request's cost to the client's key, `Spend.charge`), and an answered request
        counted (499: the client left first). ``decision`` predicted how much of the prompt
        the worker holds (None: no prediction is counted)."""
        if outcome.relayed and outcome.usage is not None:
            self._tokens(outcome.usage, decision, model, worker)
        if outcome.attempt is not ANSWERED:
            return
        if bill.spend is not None:
            bill.spend.outcome = outcome
        status = outcome.status
        self._requests(model, worker, bill.route, status).value += 1
        key = bill.key
        if key is not None:
            self._tenant_requests(key.label, key.priority, status).value += 1
        if status != CLIENT_CLOSED:
            self._e2e(model, bill.route).observe(time.monotonic() - bill.arrived)

    def counted(self, workers: Sequence[Worker], delta: int) -> None:
        """A gateway says another endpoint served the picker's request: its in-flight count
        moves (``delta`` -1 on the one it leaves, +1 on the one it joins)."""
        for worker in workers:
            worker.in_flight += delta

    def migrated(self, route: str) -> None:
        """A broken stream found an engine to go on from."""
        self._migrations(route, "migrated").inc()

    def unmoved(self, bill: Bill, worker: str, model: str) -> None:
        """A broken stream that found no engine to move to ended with an error event."""
        self.account(bill, worker, model, TryOutcome(status=STREAM_ERROR, not_migrated=True))
        self._migrations(bill.route, "not_migrated").inc()

    def shed(self, priority: str) -> None:
        """A key's request over its class's share of the in-flight limit (refused)."""
        self._shed(priority).inc()

    def unauthenticated(self, why: str) -> None:
        """A request without a valid API key (refused 401): ``missing`` or ``invalid``."""
        self._auth_failures(why).inc()

    def rate_limited(self, key: str, limit: str) -> None:
        """A key's request over one of its rate limits (refused 429)."""
        self._rate_limited(key, limit).inc()

    def retry_denied(self) -> None:
        """The retry budget refused a retry."""
        self._over_budget.inc()

    def refused(self, route: str, model: str, status: int | str) -> None:
        """A request the router answered itself, before any worker had it."""
        self._requests(model, "none", route, str(status)).inc()

    def chosen(self, selection: Selected) -> None:
        """A selection is acted on: its decision counted (a pair's by its prefill's), how a
        PD-mode request is served, and the decision announced to the peers."""
        decision = selection.decision
        self.decisions[decision.outcome].value += 1
        if selection.how:
            self._pd_requests(selection.how).inc()
        if self.peers is not None:
            self.peers.routed(decision)

    def first_byte(self, decision: Decision[Worker], model: str, arrived: float | None) -> None:
        """The first byte of the answer came back: the policy's booked prefill is released,
        here and at the peers; ``arrived`` (None: not a stream) times the first token."""
        self.policy.on_prefill_done(decision)
        if self.peers is not None:
            self.peers.prefill_done(decision)
        if arrived is not None:
            self._ttft(model).observe(time.monotonic() - arrived)

    def pair_first_byte(
        self, decision: Decision[Worker], model: str, seconds: float, arrived: float | None
    ) -> None:
        """A pair's decode answered after ``seconds`` (`first_byte` for its prefill's
        decision)."""
        self._pd_ttft(model).observe(seconds)
        self.first_byte(decision, model, arrived)

    def prefilled(self, seconds: float, transfer: float | None) -> None:
        """A pair's prefill answered after ``seconds``, its KV sent in ``transfer`` (None: it
        did not say)."""
        self._pd_prefill.observe(seconds)
        if transfer is not None:
            self._pd_kv_transfer.observe(transfer)

    def ended(self, decision: Decision[Worker], succeeded: bool) -> None:
        """The policy and the peers hear that a decision's request ended."""
        self.policy.on_request_done(decision, succeeded)
        if self.peers is not None:
            self.peers.ended(decision)

    def worker_answered(self, worker: Worker, status: int) -> None:
        """A worker's whole answer, from a gateway (the picker): a 5xx one counts against
        it."""
        if status < 500:
            self.outliers.succeeded(worker)
        else:
            self._upstream_errors(worker.name, "server_error").inc()
            self.outliers.failed(worker)

    def settle(self, spend: Spend) -> None:
        """Charge a key's request what it cost, once, as it ends (`quotas`)."""
        prompt, completion, taken = spend.charge()
        spend.quota.settle(spend.reservation, taken, time.monotonic())
        label = spend.key.label
        self._tenant_tokens(label, "prompt").inc(prompt)
        self._tenant_tokens(label, "completion").inc(completion)

    def _tokens(
        self, usage: TokenCounts, decision: Decision[Worker] | None, model: str, worker: str
    ) -> None:
        key = (model, worker)
        prompt, completion, cached = usage
        prompts, completions, cacheds, predicteds = self._token_children
        (prompts.get(key) or self._prompt_tokens(key)).value += prompt
        (completions.get(key) or self._completion_tokens(key)).value += completion
        (cacheds.get(key) or self._cached_tokens(key)).value += cached
        # the series exists at zero too
        predicted = predicteds.get(key) or self._predicted_tokens(key)
        if decision is None:
            return
        ratio = decision.predicted_match_ratio
        if ratio is not None and prompt > 0:
            tokens = round(ratio * prompt)
            predicted.value += tokens
            host = round(decision.predicted_host_ratio * prompt)
            self._tier_hbm.value += tokens - host
            self._tier_host.value += host
            self._ratio_predicted.observe(ratio)
            self._ratio_actual.observe(min(1.0, cached / prompt))
