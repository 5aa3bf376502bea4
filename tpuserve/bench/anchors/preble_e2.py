"""Preble's E2 global scheduler (reference router.md §4.5), at block granularity.

Preble keeps a global prefix tree of every routed prompt and which GPUs hold each part:

- **exploit**: if the prompt's new tokens (past the longest prefix some GPU holds) are fewer
  than that cached prefix, go to a GPU holding it (several: the lowest load cost);
- **explore**: otherwise the GPU with the lowest ``load_cost + miss_cost``, where
  ``miss_cost`` = prefill time of the tokens that GPU lacks and
  ``load_cost(g)`` = prefill seconds of the requests routed to ``g`` in the last 3 minutes
  (Preble's windowed ``miss_rate x count x prefill_time``, summed per GPU) plus
  ``active(g) x median_output_len x TPOT`` (decode work in flight);
- **rebalance**: once ``50 x num_GPUs`` requests have been scheduled, an exploit target whose
  load cost is at least 1.5 x the lightest GPU's is skipped in favour of the lightest GPU, which
  then also holds the prefix (Preble's "steal" of hot subtrees, replicating them).

Differences, to keep it a routing policy like the others: the tree is kept as chained page
keys (the engine's page size) rather than tokens; each GPU's holding is an LRU of the engine's
cache size in pages (Preble evicts virtually as well); the median output length is Preble's
constant 45 tokens (AIBrix's port); the local per-GPU priority scheduler is not modelled (the
engines run SGLang's FCFS scheduler for every policy).
"""

from __future__ import annotations

import collections
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from sglang_tpu.perf_model import StepTimer
from tpuserve.bench.anchors.base import AnchorContext
from tpuserve_router.kv.block_index import block_keys
from tpuserve_router.policies.base import (
    Clock,
    Decision,
    NoHealthyWorker,
    Outcome,
    PolicyDefaults,
    RouteRequest,
    W,
)

WINDOW_SECONDS = 180.0
MEDIAN_OUTPUT_TOKENS = 45
HIGH_LOAD_THRESHOLD = 1.5
REBALANCE_AFTER_PER_GPU = 50


class PrebleE2(PolicyDefaults):
    needs_tokens: ClassVar[bool] = True

    def __init__(self, clock: Clock, timer: StepTimer, page_size: int, capacity_pages: int) -> None:
        self.clock = clock
        self.timer = timer
        self.page_size = page_size
        self.capacity_pages = max(1, capacity_pages)
        self.held: dict[str, OrderedDict[int, None]] = {}
        self.window: dict[str, collections.deque[tuple[float, float]]] = {}
        self.window_sum: dict[str, float] = {}
        self.active: dict[str, int] = {}
        self.scheduled = 0
        self._tpot = timer.decode_step_seconds(1, 1024)

    def _depth(self, name: str, keys: Sequence[int]) -> int:
        held = self.held.get(name)
        if not held:
            return 0
        depth = 0
        for key in keys:
            if key not in held:
                break
            depth += 1
        return depth

    def _load_cost(self, name: str, now: float) -> float:
        window = self.window.get(name)
        if window:
            total = self.window_sum[name]
            while window and window[0][0] < now - WINDOW_SECONDS:
                total -= window.popleft()[1]
            self.window_sum[name] = total
        prefill = self.window_sum.get(name, 0.0)
        return prefill + self.active.get(name, 0) * MEDIAN_OUTPUT_TOKENS * self._tpot

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            raise NoHealthyWorker(request.model)
        now = self.clock()
        tokens = request.token_ids or ()
        keys = block_keys(tokens, self.page_size)
        page = self.page_size
        depths = [self._depth(w.name, keys) for w in healthy]
        loads = [self._load_cost(w.name, now) for w in healthy]
        best = max(depths)
        cached = min(len(tokens), best * page)
        target_i: int
        outcome: Outcome
        if best > 0 and len(tokens) - cached < cached:
            holders = [i for i, d in enumerate(depths) if d == best]
            target_i = min(holders, key=lambda i: loads[i])
            outcome = "prefix_hit"
            lightest = min(range(len(healthy)), key=lambda i: loads[i])
            if (
                self.scheduled >= REBALANCE_AFTER_PER_GPU * len(healthy)
                and loads[target_i] >= HIGH_LOAD_THRESHOLD * loads[lightest]
                and loads[lightest] < loads[target_i]
            ):
                target_i, outcome = lightest, "balanced_away"
        else:

            def explore_cost(i: int) -> float:
                have = min(len(tokens), depths[i] * page)
                return loads[i] + self.timer.prefill_seconds(len(tokens) - have, have)

            target_i = min(range(len(healthy)), key=explore_cost)
            outcome = (
                "miss"
                if best == 0
                else ("prefix_hit" if depths[target_i] == best else "balanced_away")
            )
        target = healthy[target_i]
        have = min(len(tokens), depths[target_i] * page)
        prefill = self.timer.prefill_seconds(len(tokens) - have, have)
        self.window.setdefault(target.name, collections.deque()).append((now, prefill))
        self.window_sum[target.name] = self.window_sum.get(target.name, 0.0) + prefill
        self.active[target.name] = self.active.get(target.name, 0) + 1
        held = self.held.setdefault(target.name, OrderedDict())
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity_pages:
            held.popitem(last=False)
        self.scheduled += 1
        ratio = have / len(tokens) if tokens else 0.0
        return Decision(target, outcome, predicted_match_ratio=ratio, prompt_units=len(tokens))

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        name = decision.worker.name
        self.active[name] = max(0, self.active.get(name, 0) - 1)

    def on_worker_reset(self, name: str) -> None:
        self.held.pop(name, None)

    def on_workers_changed(self, names: Collection[str]) -> None:
        for name in list(self.held):
            if name not in names:
                del self.held[name]


def make(ctx: AnchorContext) -> PrebleE2:
    return PrebleE2(ctx.clock, ctx.timer, ctx.page_size, ctx.cache_tokens // ctx.page_size)
