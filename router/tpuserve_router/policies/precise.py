"""precise: prefix routing on what the engines report holding (their KV events).

The index (`BlockIndex`) is rebuilt from every worker's KV events: ``BlockStored`` adds
blocks under keys recomputed from the events' token ids, ``BlockRemoved`` drops them,
``AllBlocksCleared``, an engine restart (its event sequence number goes back) and a
resync after lost events drop everything that worker held (`tpuserve_router.kv_events`
does the sequencing). A request's token ids (chat template applied, as the engine
tokenizes them) are cut into pages of the engine's page size, learned from the events.

Per request, as sglang-router's KV-event-fed ``cache_aware_zmq`` (the rule `cache_aware`
also follows, `prefix_routing.choose_by_affinity`, here measured in blocks):

1. Imbalanced load (same test and defaults as `cache_aware`: in-flight
   ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``)
   -> the least loaded worker.
2. Else, with ``match`` = the longest run of leading blocks a worker holds over the
   prompt's blocks: if ``match > cache_threshold`` -> the least loaded worker among those
   holding that longest run (``prefix_hit``);
3. else -> the least loaded worker (``miss``).

The chosen worker's blocks are also *predicted* in the index for
``predicted_ttl_seconds`` (2 s), so a burst of siblings that arrives before the engine's
first ``BlockStored`` still lands together (Dynamo's predict-on-route). A worker that
publishes no events keeps predictions for ``approximate_ttl_seconds`` (120 s), so the
policy degrades to approximate routing rather than to random.
"""

from __future__ import annotations

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
    AffinityParams,
    BlockIndexPolicy,
    IndexParams,
    choose_by_affinity,
    make_index,
)


@dataclass(frozen=True)
class PreciseParams(AffinityParams, IndexParams):
    def validate(self) -> str | None:
        return AffinityParams.validate(self) or IndexParams.validate(self)


@register("precise")
class PrecisePolicy(BlockIndexPolicy):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        self.params = build_params(self.name, PreciseParams, config)
        self.block_index = make_index(self.params, clock)

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = healthy_workers(workers, request.model)
        index = self.block_index
        tokens = request.token_ids or ()
        keys = index.keys(tokens)
        depths = index.match(keys, [w.name for w in healthy])
        i, outcome = choose_by_affinity(healthy, depths, len(keys), self.params)
        target = healthy[i]
        index.predict(target.name, keys)
        ratio = min(1.0, depths[i] * index.page_size / len(tokens)) if tokens else 0.0
        return Decision(target, outcome, predicted_match_ratio=ratio, prompt_units=len(tokens))
