"""sglang-router ``cache_aware``, both miss paths, both default sets (reference router.md §3).

Per request (gateway version, [R2]):

1. Loads are the router's in-flight counts over *all* workers. If
   ``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold`` the request
   goes to the least loaded healthy worker (first of equals) and its text is still inserted.
2. Otherwise ``(matched, tenant) = tree.prefix_match(text)``; ``match_rate = matched / len``.
   Above ``cache_threshold`` the target is ``tenant`` (whichever worker the deepest matched node
   lists first). Else the miss path: **v2** (current) the least loaded healthy worker; **v1**
   (sgl-router @026f853) ``tree.get_smallest_tenant()``, the worker with the least text.
3. If the target is healthy its text is inserted for it; otherwise the first healthy worker.

Every ``eviction_interval_secs`` (a background thread in Rust; checked on each request here,
on the injected clock) every tenant is trimmed to ``max_tree_size`` characters.

Default sets ([R8] CLI, what users run; [R2b] ``CacheAwareConfig::default()``):

=========================  =======  ======
parameter                  CLI      struct
=========================  =======  ======
cache_threshold            0.3      0.5
balance_abs_threshold      64       32
balance_rel_threshold      1.5      1.1
eviction_interval_secs     120      30
max_tree_size (chars)      2**26    10,000
=========================  =======  ======
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import ClassVar

from tpuserve.bench.anchors.base import AnchorContext, AnchorFactory
from tpuserve.bench.anchors.sglang_tree import EMPTY, SglangTree
from tpuserve_router.policies.base import (
    Clock,
    Decision,
    NoHealthyWorker,
    Outcome,
    PolicyDefaults,
    RouteRequest,
    W,
)


@dataclass(frozen=True)
class SglangDefaults:
    cache_threshold: float
    balance_abs_threshold: int
    balance_rel_threshold: float
    eviction_interval_secs: float
    max_tree_size: int


CLI_DEFAULTS = SglangDefaults(0.3, 64, 1.5, 120.0, 2**26)
STRUCT_DEFAULTS = SglangDefaults(0.5, 32, 1.1, 30.0, 10_000)


class SglangCacheAware(PolicyDefaults):
    needs_text: ClassVar[bool] = True

    def __init__(self, name: str, miss_path: str, defaults: SglangDefaults, clock: Clock) -> None:
        if miss_path not in ("smallest_tree", "least_load"):
            raise ValueError(f"miss_path: {miss_path!r}; allowed: smallest_tree, least_load")
        self.anchor_name = name
        self.miss_path = miss_path
        self.config = defaults
        self.clock = clock
        self.tree = SglangTree()
        self._known: set[str] = set()
        self._next_eviction = clock() + defaults.eviction_interval_secs

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _maybe_evict(self) -> None:
        now = self.clock()
        interval = self.config.eviction_interval_secs
        if interval > 0 and now >= self._next_eviction:
            self.tree.evict_tenant_by_size(self.config.max_tree_size)
            self._next_eviction = now + interval

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        cfg = self.config
        healthy = [w for w in workers if w.healthy]
        if not healthy:
            raise NoHealthyWorker(request.model)
        now_ms = self._now_ms()
        for w in workers:  # sglang-router inserts "" for every worker it is told about
            if w.name not in self._known:
                self._known.add(w.name)
                self.tree.insert("", w.name, now_ms)
        self._maybe_evict()
        text = request.text
        loads = [w.in_flight for w in workers]
        low, high = min(loads), max(loads)
        if high - low > cfg.balance_abs_threshold and high > low * cfg.balance_rel_threshold:
            target = min(healthy, key=lambda w: w.in_flight)
            if text:
                self.tree.insert(text, target.name, now_ms)
            return Decision(target, "balanced_away", prompt_units=len(text))
        matched, tenant = self.tree.prefix_match(text, now_ms)
        rate = matched / len(text) if text else 0.0
        outcome: Outcome
        if rate > cfg.cache_threshold:
            target_name, outcome = tenant, "prefix_hit"
        elif self.miss_path == "least_load":
            target_name, outcome = min(healthy, key=lambda w: w.in_flight).name, "miss"
        else:
            target_name, outcome = self.tree.get_smallest_tenant(), "miss"
        by_name = {w.name: w for w in workers}
        chosen = by_name.get(target_name)
        if chosen is not None and chosen.healthy:
            self.tree.insert(text, chosen.name, now_ms)
            ratio = rate if outcome == "prefix_hit" else 0.0
            return Decision(chosen, outcome, predicted_match_ratio=ratio, prompt_units=len(text))
        if chosen is None and target_name != EMPTY:
            self.tree.remove_tenant(target_name)
        return Decision(healthy[0], outcome, prompt_units=len(text))

    def on_workers_changed(self, names: Collection[str]) -> None:
        keep = set(names)
        for tenant in list(self.tree.tenant_char_count):
            if tenant not in keep:
                self.tree.remove_tenant(tenant)
                self._known.discard(tenant)


def factory(miss_path: str, defaults: SglangDefaults, name: str) -> AnchorFactory:
    def make(ctx: AnchorContext) -> SglangCacheAware:
        return SglangCacheAware(name, miss_path, defaults, ctx.clock)

    return make
