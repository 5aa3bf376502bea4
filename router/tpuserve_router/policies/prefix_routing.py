"""What the prefix policies share: one affinity-or-load rule, and the block-index plumbing.

`cache_aware` and `precise` decide alike and differ only in how they measure what a worker
holds (characters in a `PrefixTree`, leading blocks in a `BlockIndex`). `choose_by_affinity`
is that decision, sglang-router's ``cache_aware`` rule:

1. imbalanced load (`is_imbalanced` with ``balance_abs_threshold`` and
   ``balance_rel_threshold``) -> the least loaded worker (``prefix_hit`` if it holds the
   longest prefix anyway, else ``balanced_away``; ``miss`` when nobody held enough);
2. else, when the longest prefix held is more than ``cache_threshold`` of the prompt -> the
   least loaded of the workers holding it (``prefix_hit``);
3. else -> the least loaded worker, ties broken by the policy's ``miss_key`` (``miss``).

`precise` and `cost` own a `BlockIndex` fed by the workers' KV events: `IndexParams` are its
parameters, `make_index` builds it, and `BlockIndexPolicy` forgets a worker's blocks when the
worker is reset or leaves, and asks the router for KV events and token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve_router.block_index import BlockIndex
from tpuserve_router.policies.base import (
    Clock,
    Outcome,
    PolicyDefaults,
    W,
    in_flight_of,
    is_imbalanced,
)


def cache_threshold_problem(value: float) -> str | None:
    if not 0.0 <= value <= 1.0:
        return f"cache_threshold={value} must be within [0, 1]"
    return None


@dataclass(frozen=True)
class AffinityParams:
    """Parameters of `choose_by_affinity` (sglang-router's command-line defaults)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5

    def validate(self) -> str | None:
        if problem := cache_threshold_problem(self.cache_threshold):
            return problem
        if self.balance_abs_threshold < 0:
            return f"balance_abs_threshold={self.balance_abs_threshold} must be >= 0"
        if self.balance_rel_threshold < 1.0:
            return f"balance_rel_threshold={self.balance_rel_threshold} must be >= 1"
        return None


def choose_by_affinity(
    healthy: Sequence[W],
    held: Sequence[int],
    prompt_units: int,
    params: AffinityParams,
    miss_key: Callable[[W], Any] = in_flight_of,
) -> tuple[int, Outcome]:
    """The index in ``healthy`` of the worker to use, and why.

    ``held[i]`` is how much of the prompt ``healthy[i]`` holds, in the units of which the
    prompt has ``prompt_units``. Among equals the first listed wins.
    """
    count = len(healthy)
    best = max(held)
    is_hit = prompt_units > 0 and best / prompt_units > params.cache_threshold
    if count > 1 and is_imbalanced(
        healthy, params.balance_abs_threshold, params.balance_rel_threshold
    ):
        target = min(range(count), key=lambda i: healthy[i].in_flight)
        if not is_hit:
            return target, "miss"
        return target, "prefix_hit" if held[target] == best else "balanced_away"
    if is_hit:
        holders = [i for i in range(count) if held[i] == best]
        return min(holders, key=lambda i: healthy[i].in_flight), "prefix_hit"
    return min(range(count), key=lambda i: miss_key(healthy[i])), "miss"


@dataclass(frozen=True)
class IndexParams:
    """Parameters of a policy's `BlockIndex` (see `tpuserve_router.block_index`)."""

    page_size: int = 16
    predicted_ttl_seconds: float = 2.0
    approximate_ttl_seconds: float = 120.0
    max_predicted_blocks: int = 2**18

    def validate(self) -> str | None:
        if self.page_size < 1:
            return f"page_size={self.page_size} must be >= 1"
        if self.predicted_ttl_seconds < 0:
            return f"predicted_ttl_seconds={self.predicted_ttl_seconds} must be >= 0"
        if self.approximate_ttl_seconds < 0:
            return f"approximate_ttl_seconds={self.approximate_ttl_seconds} must be >= 0"
        if self.max_predicted_blocks < 0:
            return f"max_predicted_blocks={self.max_predicted_blocks} must be >= 0"
        return None


def make_index(params: IndexParams, clock: Clock) -> BlockIndex:
    return BlockIndex(
        page_size=params.page_size,
        predicted_ttl_seconds=params.predicted_ttl_seconds,
        approximate_ttl_seconds=params.approximate_ttl_seconds,
        max_predicted_blocks=params.max_predicted_blocks,
        clock=clock,
    )


class BlockIndexPolicy(PolicyDefaults):
    """A policy routing on a `BlockIndex`: it needs the prompt's token ids, the router feeds
    the index with the workers' KV events, and a worker's blocks go when it is reset or
    leaves."""

    needs_tokens = True
    uses_kv_events = True
    block_index: BlockIndex

    def on_worker_reset(self, name: str) -> None:
        self.block_index.clear(name)

    def on_workers_changed(self, names: Collection[str]) -> None:
        keep = set(names)
        for name in self.block_index.workers():
            if name not in keep:
                self.block_index.forget(name)
