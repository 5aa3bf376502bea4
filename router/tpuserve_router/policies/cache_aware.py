"""cache_aware: sglang-router's approximate prefix-tree policy, with two fixes.

Algorithm (sglang-router `cache_aware`, per request):

1. Load check. With ``loads`` = in-flight requests of the routable workers, the fleet is
   *imbalanced* when ``max - min > balance_abs_threshold`` and
   ``max > balance_rel_threshold * min``. Then the request goes to the least loaded
   worker, whatever the cache says (outcome ``balanced_away`` if another worker held
   the prefix, else ``miss``).
2. Otherwise match the request's text against the model's `PrefixTree`, which records,
   for each worker, the text of the requests routed to it. ``match_rate`` = longest
   prefix a worker holds / text length. If ``match_rate > cache_threshold`` the request
   goes to the worker holding that longest prefix (ties: the least loaded of them), outcome
   ``prefix_hit``.
3. Else (a miss) it goes to the least loaded worker (ties: the one whose tree holds the
   fewest characters, i.e. the most free cache), outcome ``miss``.
4. In every case the request's text is inserted for the chosen worker.

Parameters and defaults (sglang-router's command-line defaults, which users run; its
Rust struct defaults differ, see docs/router.md):

- ``cache_threshold`` = 0.3: minimum matched share of the prompt to follow affinity.
- ``balance_abs_threshold`` = 64 and ``balance_rel_threshold`` = 1.5: imbalance test.
- ``max_tree_size`` = 2**24: characters of text remembered per worker; beyond it the
  worker's least recently used text is evicted at once (sglang-router: 2**26, enforced by
  a background thread every ``eviction_interval_secs``, and per worker by accident).

What differs from sglang-router, on purpose: the miss path goes to the least loaded worker,
not to the one with the smallest tree (whose "death spiral" sent every miss to an
overloaded worker, sglang#14305); the imbalance test looks only at routable workers; among
several workers holding the longest prefix the least loaded wins (sglang: arbitrary);
memory is bounded at every insert, with no background thread.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve_router.policies.base import (
    Clock,
    Decision,
    PolicyDefaults,
    RouteRequest,
    W,
    build_params,
    healthy_workers,
    register,
)
from tpuserve_router.policies.prefix_routing import AffinityParams, choose_by_affinity
from tpuserve_router.policies.prefix_tree import PrefixTree


@dataclass(frozen=True)
class CacheAwareParams(AffinityParams):
    max_tree_size: int = 2**24

    def validate(self) -> str | None:
        if problem := super().validate():
            return problem
        if self.max_tree_size < 1:
            return f"max_tree_size={self.max_tree_size} must be >= 1"
        return None


@register("cache_aware")
class CacheAwarePolicy(PolicyDefaults):
    needs_text = True

    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        self.params = build_params(self.name, CacheAwareParams, config)
        self._trees: dict[str, PrefixTree] = {}

    def tree(self, model: str) -> PrefixTree:
        """The prefix tree of ``model`` ("" = the router's only or default model)."""
        tree = self._trees.get(model)
        if tree is None:
            tree = self._trees[model] = PrefixTree(self.params.max_tree_size)
        return tree

    @property
    def indexed_chars(self) -> int:
        return sum(t.total_chars for t in self._trees.values())

    def index_sizes(self) -> dict[str, int]:
        return {"tree_chars": self.indexed_chars}

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        healthy = healthy_workers(workers, request.model)
        tree = self.tree(request.model)
        text = request.text
        matched = tree.match(text) if text else {}
        held = [matched.get(w.name, 0) for w in healthy]
        i, outcome = choose_by_affinity(
            healthy,
            held,
            len(text),
            self.params,
            miss_key=lambda w: (w.in_flight, tree.tenant_chars(w.name)),
        )
        target = healthy[i]
        tree.insert(text, target.name)
        ratio = held[i] / len(text) if text else 0.0
        return Decision(target, outcome, predicted_match_ratio=ratio, prompt_units=len(text))

    def on_workers_changed(self, names: Collection[str]) -> None:
        keep = set(names)
        for tree in self._trees.values():
            for tenant in tree.tenants():
                if tenant not in keep:
                    tree.remove_tenant(tenant)

    def on_worker_reset(self, name: str) -> None:
        for tree in self._trees.values():
            tree.remove_tenant(name)
