"""NVIDIA Dynamo's KV router cost function (reference router.md §4.2), temperature 0.

``cost(w) = overlap_score_weight x prefill_blocks(w) + decode_blocks(w)``, the minimum wins
(ties at random, as Dynamo samples among equal logits):

- ``prefill_blocks(w)`` = the request's blocks ``w`` does not hold (its KV indexer, fed by the
  engines' KV events, no predict-on-route) plus the uncached blocks of requests routed to ``w``
  whose prefill has not finished (the router's active prefill load);
- ``decode_blocks(w)`` = distinct blocks of the sequences active on ``w`` (shared prefix blocks
  counted once, as Dynamo's active-sequence tracker does; output blocks not tracked, its
  default).

``overlap_score_weight`` defaults to 1; the benchmark also runs 0, 0.5 and 2.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from tpuserve.bench.anchors.base import AnchorContext, AnchorFactory
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.policies.base import (
    Decision,
    NoHealthyWorker,
    Outcome,
    PolicyDefaults,
    RouteRequest,
    W,
)


class DynamoCost(PolicyDefaults):
    needs_tokens: ClassVar[bool] = True
    block_index: BlockIndex

    def __init__(self, ctx: AnchorContext, overlap_weight: float) -> None:
        self.weight = overlap_weight
        self.rng = random.Random(ctx.seed)
        self.block_index = BlockIndex(
            page_size=ctx.page_size, predicted_ttl_seconds=0.0, approximate_ttl_seconds=0.0,
            clock=ctx.clock,
        )  # fmt: skip
        self._prefill: dict[str, int] = {}
        self._active: dict[str, Counter[int]] = {}
        self._keys: dict[int, Sequence[int]] = {}

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            raise NoHealthyWorker(request.model)
        index = self.block_index
        tokens = request.token_ids or ()
        keys = index.keys(tokens)
        page = index.page_size
        blocks = -(-len(tokens) // page)
        depths = index.match(keys, [w.name for w in healthy])
        costs = []
        for i, w in enumerate(healthy):
            prefill = blocks - depths[i] + self._prefill.get(w.name, 0)
            decode = len(self._active.get(w.name, ()))
            costs.append(self.weight * prefill + decode)
        low = min(costs)
        ties = [i for i, c in enumerate(costs) if c == low]
        i = ties[0] if len(ties) == 1 else self.rng.choice(ties)
        target = healthy[i]
        uncached = blocks - depths[i]
        self._prefill[target.name] = self._prefill.get(target.name, 0) + uncached
        self._active.setdefault(target.name, Counter()).update(keys)
        top = max(depths)
        outcome: Outcome = (
            "miss" if top == 0 else ("prefix_hit" if depths[i] == top else "balanced_away")
        )
        decision = Decision(
            target, outcome, predicted_match_ratio=depths[i] / blocks if blocks else 0.0,
            prompt_units=len(tokens), pending_units=uncached,
        )  # fmt: skip
        self._keys[id(decision)] = keys  # the caller keeps the decision until it is done
        return decision

    def on_prefill_done(self, decision: Decision[Any]) -> None:
        if decision.pending_units:
            name = decision.worker.name
            self._prefill[name] = max(0, self._prefill.get(name, 0) - decision.pending_units)
            decision.pending_units = 0

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        self.on_prefill_done(decision)
        keys = self._keys.pop(id(decision), None)
        active = self._active.get(decision.worker.name)
        if keys and active is not None:
            active.subtract(keys)
            for key in keys:
                if active.get(key, 0) <= 0:
                    active.pop(key, None)

    def on_worker_reset(self, name: str) -> None:
        self.block_index.clear(name)

    def on_workers_changed(self, names: Collection[str]) -> None:
        for name in self.block_index.workers():
            if name not in names:
                self.block_index.forget(name)


def factory(weight: float) -> AnchorFactory:
    def make(ctx: AnchorContext) -> DynamoCost:
        return DynamoCost(ctx, weight)

    return make
