"""precise: prefix routing on what the engines report holding (their KV events).

The index (`BlockIndex`) is rebuilt from every worker's KV events: ``BlockStored`` adds
blocks under keys recomputed from the events' token ids, ``BlockRemoved`` drops them,
``AllBlocksCleared``, an engine restart (its event sequence number goes back) and a
resync after lost events drop everything that worker held (`tpuserve_router.kv_events`
does the sequencing). A request's token ids (chat template applied, as the engine
tokenizes them) are cut into pages of the engine's page size, learned from the events.

Per request, as sglang-router's KV-event-fed ``cache_aware_zmq``:

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
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve_router.block_index import BlockIndex
from tpuserve_router.policies.base import (
    Clock,
    Decision,
    Outcome,
    PolicyDefaults,
    RouteRequest,
    W,
    build_params,
    healthy_workers,
    is_imbalanced,
    least_loaded,
    register,
)


@dataclass(frozen=True)
class PreciseParams:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    page_size: int = 16
    predicted_ttl_seconds: float = 2.0
    approximate_ttl_seconds: float = 120.0
    max_predicted_blocks: int = 2**18

    def validate(self) -> str | None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            return f"cache_threshold={self.cache_threshold} must be within [0, 1]"
        if self.balance_abs_threshold < 0:
            return f"balance_abs_threshold={self.balance_abs_threshold} must be >= 0"
        if self.balance_rel_threshold < 1.0:
            return f"balance_rel_threshold={self.balance_rel_threshold} must be >= 1"
        return validate_index_params(self)


def validate_index_params(params: Any) -> str | None:
    """Range checks shared by the policies that own a `BlockIndex`."""
    if params.page_size < 1:
        return f"page_size={params.page_size} must be >= 1"
    if params.predicted_ttl_seconds < 0:
        return f"predicted_ttl_seconds={params.predicted_ttl_seconds} must be >= 0"
    if params.approximate_ttl_seconds < 0:
        return f"approximate_ttl_seconds={params.approximate_ttl_seconds} must be >= 0"
    if params.max_predicted_blocks < 0:
        return f"max_predicted_blocks={params.max_predicted_blocks} must be >= 0"
    return None


def make_index(params: Any, clock: Clock) -> BlockIndex:
    return BlockIndex(
        page_size=params.page_size,
        predicted_ttl_seconds=params.predicted_ttl_seconds,
        approximate_ttl_seconds=params.approximate_ttl_seconds,
        max_predicted_blocks=params.max_predicted_blocks,
        clock=clock,
    )


@register("precise")
class PrecisePolicy(PolicyDefaults):
    needs_tokens = True
    uses_kv_events = True

    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        self.params = build_params(self.name, PreciseParams, config)
        self.block_index = make_index(self.params, clock)

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        params = self.params
        healthy = healthy_workers(workers, request.model)
        index = self.block_index
        tokens = request.token_ids or ()
        keys = index.keys(tokens)
        depths = index.match(keys, [w.name for w in healthy])
        best = max(depths)
        is_hit = bool(keys) and best / len(keys) > params.cache_threshold
        target: W
        outcome: Outcome
        if len(healthy) > 1 and is_imbalanced(
            healthy, params.balance_abs_threshold, params.balance_rel_threshold
        ):
            target = least_loaded(healthy)
            held = depths[healthy.index(target)]
            outcome = ("prefix_hit" if held == best else "balanced_away") if is_hit else "miss"
        elif is_hit:
            target = least_loaded([w for w, d in zip(healthy, depths, strict=True) if d == best])
            outcome = "prefix_hit"
        else:
            target = least_loaded(healthy)
            outcome = "miss"
        index.predict(target.name, keys)
        held = depths[healthy.index(target)]
        ratio = min(1.0, held * index.page_size / len(tokens)) if tokens else 0.0
        return Decision(target, outcome, predicted_match_ratio=ratio, prompt_units=len(tokens))

    def on_worker_reset(self, name: str) -> None:
        self.block_index.clear(name)

    def on_workers_changed(self, names: Collection[str]) -> None:
        keep = set(names)
        for name in self.block_index.workers():
            if name not in keep:
                self.block_index.forget(name)
