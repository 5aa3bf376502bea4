"""llm-d EPP (GIE) default profile with the approximate prefix scorer (reference router.md §4.1).

``score(pod) = 2 x queue + 2 x kv_cache_utilization + 3 x prefix``, then the max-score picker
(shuffle, take the top: ties are random). Scorers, each in [0, 1]:

- queue: ``(maxQ - q) / (maxQ - minQ)`` over the pods' waiting-queue lengths, 1.0 for every pod
  when all are equal (the EPP scrapes ``num_queue_reqs``; here it is read from the engine);
- kv-cache utilization: ``1 - kv_usage`` (the engine's token usage);
- prefix (approximate): the prompt's characters cut into blocks of ``16 x 4 = 64`` characters
  (at most 256 blocks, plus a final partial block), chained hashes seeded by the model name;
  ``score = leading blocks the pod holds / blocks``. Each pod's blocks live in an LRU of 31,250
  entries, filled with the chosen pod's blocks when a request is routed (``PreRequest``).

The EPP hashes JSON-marshalled chat messages; this anchor hashes the router's routing text,
which keeps the same prefix structure.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from tpuserve.bench.anchors.base import AnchorContext, AnchorUnavailable, EngineView
from tpuserve_router.policies.base import (
    Decision,
    NoHealthyWorker,
    PolicyDefaults,
    RouteRequest,
    W,
)

BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4
MAX_BLOCKS = 256
LRU_BLOCKS = 31_250
WEIGHTS = {"queue": 2.0, "kv_cache_utilization": 2.0, "prefix": 3.0}


def block_hashes(text: str, model: str = "") -> list[int]:
    size = BLOCK_TOKENS * CHARS_PER_TOKEN
    parent = hash(("gie", model))
    out: list[int] = []
    for start in range(0, min(len(text), size * MAX_BLOCKS), size):
        parent = hash((parent, text[start : start + size]))
        out.append(parent)
    return out


class GieApprox(PolicyDefaults):
    needs_text: ClassVar[bool] = True

    def __init__(self, engines: Mapping[str, EngineView], seed: int) -> None:
        self.engines = engines
        self.rng = random.Random(seed)
        self.lru: dict[str, OrderedDict[int, None]] = {}

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            raise NoHealthyWorker(request.model)
        keys = block_hashes(request.text, request.model)
        queues = [self.engines[w.name].num_waiting for w in healthy]
        low, high = min(queues), max(queues)
        best: list[int] = []
        best_score = -1.0
        order = list(range(len(healthy)))
        self.rng.shuffle(order)
        prefix_scores: list[float] = [0.0] * len(healthy)
        for i in order:
            w = healthy[i]
            queue = 1.0 if high == low else (high - queues[i]) / (high - low)
            kv = 1.0 - min(1.0, max(0.0, self.engines[w.name].token_usage))
            held = self.lru.get(w.name)
            depth = 0
            if held is not None:
                for key in keys:
                    if key not in held:
                        break
                    depth += 1
            prefix = depth / len(keys) if keys else 0.0
            prefix_scores[i] = prefix
            score = WEIGHTS["queue"] * queue + WEIGHTS["kv_cache_utilization"] * kv
            score += WEIGHTS["prefix"] * prefix
            if score > best_score:
                best, best_score = [i], score
        target_i = best[0]
        target = healthy[target_i]
        lru = self.lru.setdefault(target.name, OrderedDict())
        for key in keys:
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > LRU_BLOCKS:
            lru.popitem(last=False)
        top = max(prefix_scores)
        ratio = prefix_scores[target_i]
        outcome: Any = "miss" if top == 0 else ("prefix_hit" if ratio == top else "balanced_away")
        return Decision(target, outcome, predicted_match_ratio=ratio, prompt_units=len(keys))

    def on_workers_changed(self, names: Collection[str]) -> None:
        for name in list(self.lru):
            if name not in names:
                del self.lru[name]


def make(ctx: AnchorContext) -> GieApprox:
    if ctx.engines is None:
        raise AnchorUnavailable("gie_approx reads engine queues and KV usage: sim mode only")
    return GieApprox(ctx.engines, ctx.seed)
