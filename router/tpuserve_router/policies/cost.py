"""cost: the worker with the lowest predicted time to first token, under a load bound.

For each routable worker ``w`` the policy predicts, in prefill-token units,

    cost(w) = queued_prefill(w) + (prompt_tokens - cached_tokens(w)) + decode_weight * in_flight(w)

- ``cached_tokens(w)``: the longest run of the prompt's leading blocks ``w`` holds, from the
  `BlockIndex` (confirmed by KV events when the engines publish them, otherwise predicted
  from what was routed, as `precise` does);
- ``queued_prefill(w)``: uncached prompt tokens of requests sent to ``w`` whose prefill is
  not over (`prefix_routing.PrefillQueues`: no first byte yet, and the engine has not
  reported the prompt's last block), plus what other router replicas queued there as of the
  last load poll (``peer_prefill_tokens``), the work ahead of this request in ``w``'s queue;
- ``decode_weight * in_flight(w)``: each running sequence slows every engine step a little
  (default 8 tokens' worth of prefill per running request).

It picks the minimum, ties to the least loaded. There are no thresholds: a cached prefix
is worth exactly the prefill it saves, so affinity holds while the holder's queue is
shorter than the prefill a cold worker would do, and is given up exactly when it is not.

Hot prefixes are replicated instead of piling up: when a prefix is so popular that its
holder's queue outweighs a fresh prefill elsewhere, the next request goes to another
worker, which then holds the prefix too, and the two share it. A bounded-load rule keeps
any worker from being overloaded meanwhile (consistent hashing with bounded loads): a
worker is a candidate only if ``in_flight + 1 <= ceil(load_factor * (total + 1) / n)``
(default ``load_factor`` 1.25), so max/mean load stays near 1.25 even when one prefix
takes most of the traffic. The least loaded worker always qualifies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve_router.policies.base import (
    Clock,
    Decision,
    RouteRequest,
    W,
    build_params,
    healthy_workers,
    register,
)
from tpuserve_router.policies.prefix_routing import (
    LOAD_FACTOR,
    BlockIndexPolicy,
    IndexParams,
    affinity_outcome,
    cache_threshold_problem,
)


@dataclass(frozen=True)
class CostParams(IndexParams):
    decode_weight: float = 8.0
    load_factor: float = LOAD_FACTOR
    cache_threshold: float = 0.3
    """Only labels decisions (prefix_hit / balanced_away / miss); never steers them."""

    def validate(self) -> str | None:
        if self.decode_weight < 0:
            return f"decode_weight={self.decode_weight} must be >= 0"
        if self.load_factor < 1.0:
            return f"load_factor={self.load_factor} must be >= 1"
        return cache_threshold_problem(self.cache_threshold) or super().validate()


@register("cost")
class CostPolicy(BlockIndexPolicy):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        self.params = build_params(self.name, CostParams, config)
        self.start_index(self.params, clock)

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        params = self.params
        healthy = healthy_workers(workers, request.model)
        index = self.block_index
        tokens = request.token_ids or ()
        prompt = len(tokens)
        keys = index.keys(tokens)
        depths = index.match(keys, [w.name for w in healthy])
        page = index.page_size
        total = 0
        for worker in healthy:
            total += worker.in_flight
        cap = math.ceil(params.load_factor * (total + 1) / len(healthy))
        queues = self.queues
        best_i = -1
        best_cost = 0.0
        for i, worker in enumerate(healthy):
            load = worker.in_flight
            if load + 1 > cap:
                continue
            cached = min(prompt, depths[i] * page)
            queued = queues.tokens(worker.name) + worker.peer_prefill_tokens
            cost = queued + (prompt - cached) + params.decode_weight * load
            if (
                best_i < 0
                or cost < best_cost
                or (cost == best_cost and load < healthy[best_i].in_flight)
            ):
                best_i, best_cost = i, cost
        target = healthy[best_i]
        cached = min(prompt, depths[best_i] * page)
        outcome = affinity_outcome(
            [min(prompt, d * page) for d in depths], best_i, prompt, params.cache_threshold
        )
        index.predict(target.name, keys)
        decision = Decision(
            target, outcome, predicted_match_ratio=cached / prompt if prompt else 0.0,
            prompt_units=prompt, block_keys=keys,
        )  # fmt: skip
        queues.book(decision, prompt - cached, keys[-1] if keys else None)
        return decision
