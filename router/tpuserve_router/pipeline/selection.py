"""The pipeline's second stage: where one try of a request goes, one worker (`Single`) or a
prefill/decode pair (`Pair`), whatever the mode.

Outside PD mode every try is a `Single`: the policy's choice among the workers serving the
request's model (an adapter's warm replicas first; a retry among the others). In PD mode
(``--prefill``/``--decode``, ``--pd-disaggregation``) a pair is one more outcome of the same
choice, decided on the first try and kept for the retries (`Selector.select`):

- **whether to disaggregate** (``--pd-policy conditional``, the default): the policy picks a
  colocated worker as usual; when the prefill of the prompt's tokens it does not expect that
  worker to hold (the policy's predicted match) would stall that worker's running decodes for
  ``--pd-itl-budget-seconds`` or longer, the request goes to a pair instead (a prompt no
  colocated worker holds enough of goes to a pair before any choice; the choice set aside is
  undone, ``on_set_aside``). The stall is timed by ``--pd-perf-model``'s performance model
  (`sglang_tpu.disaggregation.prefill_stalls`), or a fixed ``--pd-threshold-tokens``. It is
  the chosen worker's cache that counts: a policy that balances load away from the worker
  holding the prefix makes that prefill whole. A decode engine cannot prefill a request itself,
  so "not disaggregated" needs colocated workers; with none, every request goes to a pair, and
  so it does with ``--pd-policy always``;
- **the prefill worker**: the policy over the healthy prefill workers that have a decode to
  pair with (`pairs`: equal pairing contracts);
- **the decode worker**: the healthy one with the fewest requests in flight, ties at random.

No healthy pair on the first try: a colocated worker takes it (503 when none is healthy); a
pair's retry goes to a new pair whose workers were not tried while others are left (which leg
fails first can be a race of the engines' timers), else 503.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from sglang_tpu import disaggregation
from tpuserve_router.engines.workers import Worker
from tpuserve_router.pipeline.pd_settings import DECODE, PREFILL, PdSettings
from tpuserve_router.pipeline.refusals import unavailable
from tpuserve_router.pipeline.stages import Admitted, Pipeline, Refused
from tpuserve_router.policies.base import Decision, NoHealthyWorker, Policy, RouteRequest

PAIR: Final = "pair"
SINGLE: Final = "single"


@dataclass(frozen=True, slots=True)
class Single:
    """A try on one worker: the policy's ``decision``, among ``candidates`` (what a retry of
    it may go to, the others)."""

    decision: Decision[Worker]
    candidates: Sequence[Worker]
    how: str = ""
    """In PD mode, on its first try: colocated or no_prefill (`ledger.PD_ROUTES`) ("" otherwise)."""

    @property
    def workers(self) -> tuple[Worker, ...]:
        return (self.decision.worker,)

    @property
    def answering(self) -> Worker:
        """The worker whose answer the client gets."""
        return self.decision.worker


@dataclass(frozen=True, slots=True)
class Pair:
    """A try on a prefill/decode pair: the policy's ``prefill`` decision and the ``decode``
    worker, whose answer the client gets."""

    prefill: Decision[Worker]
    decode: Worker
    how: str = ""
    """On its first try: "disaggregated" ("" on a retry)."""

    @property
    def decision(self) -> Decision[Worker]:
        return self.prefill

    @property
    def workers(self) -> tuple[Worker, ...]:
        return (self.prefill.worker, self.decode)

    @property
    def answering(self) -> Worker:
        return self.decode


Selection = Single | Pair


@dataclass(slots=True)
class Route:
    """One request's tries so far, as selection reads them."""

    mode: str = ""
    """`SINGLE` or `PAIR` once its first try was decided ("": not yet)."""
    tried: list[Worker] = field(default_factory=list)
    """The workers of its tries that failed."""
    retries: int = 0
    migrations: int = 0
    """Times its stream moved to another engine (`migration`)."""


def split(workers: Sequence[Worker]) -> tuple[list[Worker], list[Worker]]:
    """(prefill, decode) workers of a request's candidates."""
    return [w for w in workers if w.role == PREFILL], [w for w in workers if w.role == DECODE]


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


class Disaggregation:
    """PD mode's decisions: whether a request goes to a pair, and its decode worker."""

    def __init__(self, settings: PdSettings, policy: Policy, seed: int | None = None) -> None:
        self.settings = settings
        self.policy = policy
        self.random = random.Random(seed)

    def pair_possible(self, workers: Sequence[Worker]) -> bool:
        prefill, decode = split(workers)
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
        when the policy keeps no index this can read."""
        healthy = [w for w in colocated if w.healthy]
        if not healthy:
            return None
        policy = self.policy
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

    def choose_decode(self, decode: Sequence[Worker], model: str) -> Worker:
        healthy = [w for w in decode if w.healthy]
        if not healthy:
            raise NoHealthyWorker(model)
        least = min(w.in_flight for w in healthy)
        return self.random.choice([w for w in healthy if w.in_flight == least])


class Selector:
    """The selection stage: a request's next try, `Single` or `Pair`; one per router."""

    def __init__(
        self,
        pipeline: Pipeline,
        pd: Disaggregation | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.policy = pipeline.policy
        self.pd = pd
        if pd is not None:
            pipeline.pair_possible = pd.pair_possible

    def select(self, admitted: Admitted, route: Route) -> Selection:
        """Where the request's next try goes; raises `Refused` (503) when no worker (or
        pair) can take it. Not acted on until `Pipeline.chosen`."""
        pd = self.pd
        if pd is None:
            return self._single(admitted, route, admitted.served.workers)
        workers = admitted.served.workers
        colocated = [w for w in workers if w.role is None]  # pair workers never serve alone
        if route.mode == SINGLE:
            return self._single(admitted, route, colocated)
        if route.mode == PAIR:  # a pair's retry: a new pair, or none
            try:
                return self._pair(admitted, route, "")
            except NoHealthyWorker as none:
                raise Refused(
                    unavailable(f"{none} is left to retry on"), admitted.parsed.model
                ) from None
        if not pd.pair_possible(workers):
            route.mode = SINGLE
            return self._single(admitted, route, colocated, "no_prefill")
        pipeline = self.pipeline
        if pipeline.before_decision is not None:
            pipeline.before_decision()  # the prediction reads the KV events
        prompt = admitted.parsed.prompt_tokens
        uncached = pd.uncached_tokens(admitted.route_request, colocated, prompt)
        if (
            pd.settings.policy == "always"
            or not any(w.healthy for w in colocated)
            or (uncached is not None and pd.stalls(uncached, prompt))
        ):  # no colocated worker holds enough of it: a pair, before any choice
            return self._pair_or_single(admitted, route, colocated)
        # else the worker the policy chooses decides (it may not be the one holding the
        # prefix: a policy balancing load makes the prefill whole)
        single = self._single(admitted, route, colocated, "colocated")
        decision = single.decision
        chosen = decision.worker  # prefill queued there before this one
        queued = (
            self.policy.queued_prefill_tokens(chosen.name)
            - decision.pending_units
            + chosen.peer_prefill_tokens
        )
        if pd.disaggregates(decision, prompt, queued):
            self.policy.on_set_aside(decision)  # not acted on: its prediction undone
            return self._pair_or_single(admitted, route, colocated)
        route.mode = SINGLE
        return single

    def select_single(self, admitted: Admitted, candidates: Sequence[Worker]) -> Single:
        """One worker among ``candidates``, an adapter's warm replicas first (a request whose
        gateway relays it: the picker's); raises `Refused` (503)."""
        return self._single(admitted, Route(SINGLE), candidates)

    def _pair_or_single(
        self, admitted: Admitted, route: Route, colocated: Sequence[Worker]
    ) -> Selection:
        route.mode = PAIR
        try:
            return self._pair(admitted, route, "disaggregated")
        except NoHealthyWorker:  # no pair is healthy: a colocated worker, if one is
            route.mode = SINGLE
            return self._single(admitted, route, colocated)

    def _single(
        self, admitted: Admitted, route: Route, candidates: Sequence[Worker], how: str = ""
    ) -> Single:
        pipeline = self.pipeline
        if route.tried:  # a retry goes to any other candidate, warm or not
            tried = route.tried
            candidates = [w for w in candidates if w not in tried]
            first = candidates
        else:
            first = pipeline.first_choices(admitted, list(candidates))
        try:
            decision = pipeline.select(admitted, first)
        except NoHealthyWorker:
            raise pipeline.no_worker(admitted) from None
        return Single(decision, candidates, how)

    def _pair(self, admitted: Admitted, route: Route, how: str) -> Pair:
        """The prefill by the policy (`Pipeline.select`) among those with a decode they can
        pair with (`pairs`), then the decode; workers of a failed pair are not asked again
        while others are left. A first try looks among an adapter's warm replicas first, a
        retry among all. Raises `NoHealthyWorker` naming the leg no worker is left for."""
        assert self.pd is not None
        pipeline = self.pipeline
        prefill, decode = split(admitted.served.workers)
        tried = route.tried
        p_pool = [w for w in prefill if w not in tried] or prefill
        d_pool = [w for w in decode if w not in tried] or decode
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
            d_worker = self.pd.choose_decode(d_first, admitted.parsed.model)
        except NoHealthyWorker:
            self.policy.on_request_done(p_decision, False)
            raise NoHealthyWorker("no healthy decode worker") from None
        return Pair(p_decision, d_worker, how)
