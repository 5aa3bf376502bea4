"""The one request pipeline every mode runs, its stages in order:

1. **admit** (`Pipeline.admit`, `Pipeline.admit_now`): the client's API key and its rate
   limits, the router's in-flight limit (shed), its model's share (`Pipeline.over_share`), the
   body parsed and validated, the hold queue while no worker can take it, the workers serving
   its model (404 otherwise), its tokens reserved of its key's limit;
2. **select** (`tpuserve_router.pipeline.selection.Selector.select`): one worker or a
   prefill/decode pair (`Single` | `Pair`), the policy's choice among the candidates
   (`Pipeline.select`), acted on with `Pipeline.chosen`;
3. **relay**: one worker's try (`tpuserve_router.pipeline.relay.SingleRelay.relay`, whole or
   streamed) or a pair's two legs (`tpuserve_router.pipeline.pair_relay.PairRelay.relay`);
   for the endpoint picker its gateway relays;
4. **account**: the one ledger (`tpuserve_router.pipeline.ledger.Ledger.close`): tokens,
   metrics, the key's quota settled, policy and peer feedback, outlier ejection.

The driver (`tpuserve_router.pipeline.driver.Driver`) runs them, again from selection for a
retry. A front (the HTTP port's `Forwarder`, the picker's `Exchange`) turns a request into an
`Arrival`, hands it to the driver, and answers a `Refused` its own way (an HTTP error, an
``ImmediateResponse``). A feature that lives in a stage applies to every mode.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tpuserve_router.core import RouterCore
from tpuserve_router.engines.workers import ModelRoute, Worker
from tpuserve_router.pipeline.adapter_affinity import AdapterAffinity
from tpuserve_router.pipeline.generation_limits import GENERATION_LIMITS, GenerationLimit
from tpuserve_router.pipeline.ledger import Ledger, Selected, Spend
from tpuserve_router.pipeline.refusals import (
    RETRY_AFTER_SECONDS,
    model_not_found,
    unauthorized,
    unavailable,
)
from tpuserve_router.pipeline.request_body import (
    ClientError,
    ParsedBody,
    Parser,
    Tokens,
    named_route,
    parse_json_object,
)
from tpuserve_router.pipeline.request_ids import ClientRid, client_rid
from tpuserve_router.policies.base import Decision, RouteRequest
from tpuserve_router.tenancy.auth import DEFAULT_PRIORITY, ApiKey, KeyStore, presented_key
from tpuserve_router.tenancy.hold import OTHER_MODEL, HoldQueues, HoldRefused, hold_label
from tpuserve_router.tenancy.model_shares import ModelFlights
from tpuserve_router.tenancy.quotas import Quotas, Refusal, Reservation, in_flight_limits

STAGES: Final = ("admit", "select", "relay", "account")


@dataclass(slots=True)
class InFlight:
    """A front's own share of requests in flight (the endpoint picker's,
    ``--picker-max-in-flight``): counted apart from the router's own (``--max-in-flight``,
    the HTTP port's), so neither front can take the other's room."""

    limit: int
    flag: str
    """The setting that bounds it, named in a refusal."""
    count: int = 0

    @property
    def full(self) -> bool:
        return self.count >= self.limit


class Refused(Exception):
    """A request a stage answers itself: ``error``, counted on ``model`` (a bounded
    label: the served name, a hold queue's, or "")."""

    def __init__(self, error: ClientError, model: str = "") -> None:
        super().__init__(error.message)
        self.error = error
        self.model = model


@dataclass(slots=True)
class Arrival:
    """A generation request as a front hands it to admission."""

    route: str
    parser: Parser
    body: bytes
    arrived: float
    headers: Sequence[tuple[bytes, bytes]] = ()
    client: str = ""
    """Who sent it when it has no key (the hold queue's tenant)."""
    size: int = 0
    """The bytes of the buffer budget its body holds (the hold queue weighs them)."""
    may_wait: bool = True
    """It may wait in the hold queue (the HTTP port); the picker answers its gateway at
    once."""
    authenticates: bool = True
    """Its client presents the router's API keys (the HTTP port; a gateway authenticates
    the picker's own clients)."""
    shed_status: int = 503
    """The status of a request over the in-flight limit (the picker's gateway retries a
    429 elsewhere)."""
    reply_headers: bytes = b""
    """What every answer to it carries (its key's rate-limit headers), once admission knows."""
    share: InFlight | None = None
    """The in-flight share it is counted in (None: the router's own, ``--max-in-flight``)."""


@dataclass(slots=True)
class Admitted:
    """A request admission let in: what selection and the relay read."""

    arrival: Arrival
    key: ApiKey | None
    parsed: ParsedBody
    bound: GenerationLimit
    theirs: ClientRid
    """The client's own ``rid`` (`request_ids`)."""
    served: ModelRoute
    asked: str
    """The model as the client named it (``parsed.model`` is the served name: a bounded
    label); what the policy routes by."""
    since: float
    """Where ``--request-timeout`` runs from: its arrival, or its leaving the hold queue."""
    spend: Spend | None = None
    counted: bool = field(default=False)
    """It is counted in the router's in flight (`Pipeline.enter`)."""

    @property
    def route(self) -> str:
        return self.arrival.route

    @property
    def route_request(self) -> RouteRequest:
        parsed = self.parsed
        return RouteRequest(self.asked, parsed.text, parsed.token_ids)


class Pipeline:
    """The shared stages (admission, selection) and the ledger; one per router."""

    def __init__(
        self,
        core: RouterCore,
        tokenizer: Tokens | None,
        ledger: Ledger,
        holds: HoldQueues,
        *,
        keys: KeyStore | None = None,
        quotas: Quotas | None = None,
        before_decision: Callable[[], None] | None = None,
        on_arrival: Callable[[bool, str], None] | None = None,
    ) -> None:
        self.config = config = core.config
        self.policy = core.policy
        self.registry = registry = core.registry
        self.metrics = core.metrics
        self.ledger = ledger
        self.tokenizer = tokenizer
        self.want_text = core.policy.needs_text
        self.max_prompt_chars = config.max_prompt_chars
        self.max_in_flight = config.max_in_flight
        self.in_flight = 0  # generation requests between admission (or the hold) and answer
        self.keys = keys
        self.quotas = quotas if quotas is not None else Quotas()
        self.holds = holds
        self.hold_models = frozenset(config.hold_models)
        self.flights = ModelFlights(config.max_in_flight_per_model)
        self.listed_only = config.hold_models_only
        self.before_decision = before_decision
        self.on_arrival = on_arrival
        self.affinity = AdapterAffinity()
        registry.on_removed.append(lambda worker: self.affinity.forget(worker.name))
        self._shed_at = in_flight_limits(config.max_in_flight)
        self.pair_possible: Callable[[Sequence[Worker]], bool] | None = None
        """Whether a prefill/decode pair could take a request (PD mode:
        `selection.Disaggregation`)."""

    # ------------------------------------------------------------------ 1. admit

    async def admit(self, arrival: Arrival) -> Admitted:
        """Admit a request that may wait for a worker (the hold queue); raises `Refused`."""
        key, limit = self._gate(arrival)
        data = self._json(arrival)
        self.over_share(data, may_wait=arrival.may_wait)
        parsed, bound, theirs = self._parse(arrival, data)
        since = arrival.arrived
        held = arrival.may_wait and self.holds.enabled and self._must_hold(parsed.model)
        base = self.registry.split_model(parsed.model)[0]
        label = base if base and self._known(base) else OTHER_MODEL  # `hold_label`, no set made
        if self.on_arrival is not None:
            self.on_arrival(held, label)
        if held:
            label = hold_label(parsed.model, self._known_models())  # bounded, as a label
            try:
                await self.holds.hold(
                    label, arrival.arrived, functools.partial(self.routable, parsed.model),
                    tenant=key.tenant if key is not None else f"client {arrival.client}",
                    priority=key.priority if key is not None else DEFAULT_PRIORITY,
                    size=arrival.size,
                    admissible=functools.partial(
                        self._has_room, limit, self.registry.split_model(parsed.model)[0]
                    ),
                )  # fmt: skip
            except HoldRefused as refused:
                raise Refused(unavailable(str(refused)), label) from None
            since = time.monotonic()
        return self._let_in(arrival, key, parsed, bound, theirs, since)

    def admit_now(self, arrival: Arrival) -> Admitted:
        """Admit a request that is answered at once (the picker's); raises `Refused`."""
        key, _limit = self._gate(arrival)
        data = self._json(arrival)
        self.over_share(data, may_wait=False, at_once=True)
        parsed, bound, theirs = self._parse(arrival, data)
        if not self.routable(parsed.model):
            # No worker can take it now (zero replicas, say): 503 with Retry-After, which a
            # gateway retries, not the 404 of a model nobody serves. A model the router knows
            # (served, or held for: --hold-models) is demand that may wake the server.
            label = hold_label(parsed.model, self._known_models())
            if label != OTHER_MODEL and self.on_arrival is not None:
                self.on_arrival(True, label)
            raise Refused(unavailable(f"no healthy worker for model {parsed.model!r}"), label)
        admitted = self._let_in(arrival, key, parsed, bound, theirs, arrival.arrived)
        if self.on_arrival is not None:  # demand comes only from admitted requests
            self.on_arrival(False, admitted.parsed.model)
        return admitted

    def enter(self, admitted: Admitted | None, share: InFlight | None = None) -> None:
        """Count a request in flight until `leave`: an admitted one (in its arrival's share),
        or (None) one the picker sends to a worker off the generation routes, in
        ``share``."""
        if admitted is not None:
            assert not admitted.counted, "counted in flight once"
            admitted.counted = True
            share = admitted.arrival.share
            self.flights.enter(admitted.parsed.model)
        if share is not None:
            share.count += 1
        else:
            self.in_flight += 1

    def leave(self, admitted: Admitted | None, share: InFlight | None = None) -> None:
        """A request `enter` counted ended (or an admitted one never entered): out of
        flight (room for a held one, maybe), and what it cost settled on its key (the
        ledger)."""
        if admitted is None or admitted.counted:
            if admitted is not None:
                admitted.counted = False
                share = admitted.arrival.share
                self.flights.leave(admitted.parsed.model)
            if share is not None:
                share.count -= 1
            else:
                self.in_flight -= 1
                if self.holds.total:
                    self.holds.announce()
        if admitted is None:
            return
        spend, admitted.spend = admitted.spend, None
        if spend is not None:
            self.ledger.settle(spend)

    def _gate(self, arrival: Arrival) -> tuple[ApiKey | None, int]:
        """The request's key (with API keys) and the in-flight limit it is shed at."""
        key: ApiKey | None = None
        limit = self.max_in_flight
        if self.keys is not None and arrival.authenticates:
            key = self._authenticate(arrival)
            limit = self._shed_at[key.priority]
        share = arrival.share
        if share is not None:
            if share.full:
                message = (
                    f"the router has {share.count} of this front's requests in flight, its "
                    f"limit ({share.flag}); retry"
                )
                raise Refused(
                    ClientError(arrival.shed_status, message, error_type="rate_limit_exceeded")
                    if arrival.shed_status != 503
                    else unavailable(message)
                )
            return key, limit
        if self.in_flight >= limit:
            if key is not None:
                self.ledger.shed(key.priority)
            message = (
                f"the router has {self.in_flight} requests in flight, its limit "
                + ("(--max-in-flight)" if key is None else f"for {key.priority} requests")
                + "; retry"
            )
            if arrival.shed_status == 503:
                raise Refused(unavailable(message))
            raise Refused(
                ClientError(arrival.shed_status, message, error_type="rate_limit_exceeded")
            )
        return key, limit

    def _authenticate(self, arrival: Arrival) -> ApiKey:
        """The request's API key if it is valid and within its rate limits; else `Refused`
        (401, 429)."""
        assert self.keys is not None
        authorization = api_key = None
        for name, value in arrival.headers:
            if name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
        presented = presented_key(authorization, api_key)
        key = self.keys.authenticate(presented)
        if key is None:
            self.ledger.unauthenticated("missing" if not presented else "invalid")
            raise Refused(unauthorized(presented))
        quota = self.quotas.of(key, arrival.arrived)
        refused = quota.admit(arrival.arrived)
        if refused is not None:
            raise self._rate_limited(key, *refused)
        arrival.reply_headers = quota.headers()
        return key

    @staticmethod
    def _json(arrival: Arrival) -> dict[str, Any]:
        try:
            return parse_json_object(arrival.body)
        except ClientError as err:
            raise Refused(err) from None

    def over_share(self, data: dict[str, Any], *, may_wait: bool, at_once: bool = False) -> None:
        """Refuse (429) a request for a model at its share (--max-in-flight-per-model)
        before its prompt is measured, validated, tokenized or held: what a flood past its
        share costs, in the thousands a second. Only one admission would refuse anyway: its
        model (and adapter) served; not one `admit` holds (``may_wait``), nor one no worker can
        take now (``at_once``: `admit_now`'s 503). Other bad input gets its error once the
        share has room. Demand (`on_arrival`) as in `admit`, unless ``at_once``."""
        flights = self.flights
        if not flights.counts or flights.limit is None or (named := named_route(data)) is None:
            return
        served = self.registry.route(*named)
        if served is None or not flights.full(served.model):
            return
        model = named[0]
        unlisted = self.listed_only and served.model not in self.hold_models
        held = may_wait and self.holds.enabled and self._must_hold(model)
        if unlisted or held or (at_once and not self.routable(model)):
            return
        if not at_once and self.on_arrival is not None:
            self.on_arrival(False, served.model)
        raise self._share_refusal(served.model)

    def _share_refusal(self, model: str) -> Refused:
        message = (
            f"model {model!r} has {self.flights.of(model)} requests in flight, the most one "
            "model may (--max-in-flight-per-model); retry"
        )
        headers = {"retry-after": RETRY_AFTER_SECONDS}
        error = ClientError(429, message, error_type="rate_limit_exceeded", headers=headers)
        return Refused(error, model)

    def _parse(
        self, arrival: Arrival, data: dict[str, Any]
    ) -> tuple[ParsedBody, GenerationLimit, ClientRid]:
        try:
            parsed = arrival.parser(data, self.want_text, self.tokenizer, self.max_prompt_chars)
            return parsed, GENERATION_LIMITS[arrival.route](data), client_rid(data)
        except ClientError as err:
            raise Refused(err) from None

    def _let_in(
        self,
        arrival: Arrival,
        key: ApiKey | None,
        parsed: ParsedBody,
        bound: GenerationLimit,
        theirs: ClientRid,
        since: float,
    ) -> Admitted:
        """The workers serving the request's model (404 if none), and its tokens reserved of
        its key's limit (429 if they do not fit)."""
        served = self.registry.route(parsed.model, parsed.lora_path)
        if served is None or (self.listed_only and served.model not in self.hold_models):
            raise Refused(self.not_served(parsed.model, parsed.lora_path))
        asked = parsed.model
        parsed.model = served.model  # from here on the served name: a bounded label
        if self.flights.full(served.model):  # its share (--max-in-flight-per-model)
            raise self._share_refusal(served.model)
        admitted = Admitted(arrival, key, parsed, bound, theirs, served, asked, since)
        if key is not None:
            admitted.spend = self._reserve(arrival, key, parsed, bound, served.workers)
        return admitted

    def _reserve(
        self,
        arrival: Arrival,
        key: ApiKey,
        parsed: ParsedBody,
        bound: GenerationLimit,
        workers: Sequence[Worker],
    ) -> Spend:
        """Reserve what the request may cost of its key's token limit (`quotas`); `Refused`
        (429) if it does not fit."""
        quota = self.quotas.of(key, arrival.arrived)
        contexts = [w.context_tokens for w in workers if w.context_tokens is not None]
        prompt = parsed.prompt_tokens
        # nothing bounds it: what is left of the key's whole minute (no limit: nothing)
        rest = max(0, quota.tokens.per_minute - prompt) if quota.tokens is not None else 0
        completion = bound.allowance(prompt, max(contexts, default=None), rest)
        reserved = quota.reserve(prompt + completion, time.monotonic(), bound.param)
        if not isinstance(reserved, Reservation):
            raise self._rate_limited(key, *reserved)
        arrival.reply_headers = quota.headers()
        return Spend(key, quota, prompt, completion, reserved)

    def _rate_limited(self, key: ApiKey, refusal: Refusal, headers: dict[str, str]) -> Refused:
        """The 429 of a key over its limits."""
        self.ledger.rate_limited(key.label, refusal.limit)
        wait = refusal.retry_after_seconds
        message = refusal.message or (
            f"rate limit reached for {refusal.limit} per minute ({refusal.per_minute}, "
            f"tenant {key.tenant}); retry in {wait or 0:.3g} s"
        )
        return Refused(
            ClientError(
                429, message, param=refusal.param, error_type="rate_limit_exceeded",
                headers=headers,
            )
        )  # fmt: skip

    def not_served(self, model: str, lora_path: str | None) -> ClientError:
        name = f"{model!r}" + (f" with LoRA adapter {lora_path!r}" if lora_path else "")
        served = [n for n, _ in self.registry.served()]
        if self.listed_only:
            served = [n for n in served if n.partition(":")[0] in self.hold_models]
        return model_not_found(name, served)

    def _has_room(self, limit: int, model: str = "") -> bool:
        """Live traffic under ``limit`` in flight, and ``model``'s under its share
        (--max-in-flight-per-model), would be admitted now (a held request leaves the queue
        through the same admission: released at once past its model's share, it would get
        429)."""
        return self.in_flight < limit and not self.flights.full(model)

    def _must_hold(self, model: str) -> bool:
        """Whether a request for ``model`` waits in the hold queue: others of its queue
        wait already, or no worker of its base model is routable (an unknown model is held
        only while no worker at all is routable, or if it is one of --hold-models). A
        request whose adapter no routable worker has while its model has some is answered
        at once (404 or 503): held, it would block its model's queue for nothing."""
        if self.holds.total and self.holds.held(hold_label(model, self._known_models())):
            return True
        return not self.routable(model)

    def routable(self, model: str) -> bool:
        """A worker of ``model``'s base model, whatever adapter was asked, could take a
        request now (or, for a model no worker serves, the answer would be a 404 rather
        than a wait)."""
        base, _adapter = self.registry.split_model(model)
        served = self.registry.route(base)
        if served is None:
            return model not in self.hold_models and self.registry.healthy_count() > 0
        workers = served.workers
        if self.pair_possible is not None:  # a prefill or a decode engine alone: a pair
            colocated = (w for w in workers if w.role is None)
            return any(w.healthy for w in colocated) or self.pair_possible(workers)
        return any(w.healthy for w in workers)

    def _known(self, model: str) -> bool:
        """``model`` is in `_known_models` (without making the set)."""
        return model in self.registry.by_model or model in self.hold_models

    def _known_models(self) -> frozenset[str]:
        return self.hold_models.union(self.registry.by_model)

    # ------------------------------------------------------------------ 2. select

    def select(self, admitted: Admitted, pool: Sequence[Worker]) -> Decision[Worker]:
        """The policy's choice among ``pool`` (the KV events due read first); raises
        `NoHealthyWorker`. Not acted on until `chosen` (PD mode may set it aside)."""
        if self.before_decision is not None:
            self.before_decision()
        return self.policy.choose(admitted.route_request, pool)

    def chosen(self, admitted: Admitted, selection: Selected) -> None:
        """Act on ``selection`` (a worker or a pair, `selection`): counted and announced to
        the peers (the ledger), and the adapter's replicas remembered warm."""
        self.ledger.chosen(selection)
        adapter = admitted.served.adapter
        if adapter is not None:
            for worker in selection.workers:
                self.affinity.routed(adapter, worker.name)

    def first_choices(self, admitted: Admitted, candidates: list[Worker]) -> list[Worker]:
        """Where a first try looks: an adapter's warm replicas first (`adapter_affinity`)."""
        adapter = admitted.served.adapter
        return candidates if adapter is None else self.affinity.candidates(adapter, candidates)

    def no_worker(self, admitted: Admitted) -> Refused:
        """The 503 of a request no candidate can take."""
        model = admitted.asked
        detail = f" for model {model!r}" if model else ""
        return Refused(unavailable(f"no healthy worker{detail}"), admitted.served.model)
