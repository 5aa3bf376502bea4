"""precise: prefix routing on what the engines report holding (their KV events).

The index (`BlockIndex`) is rebuilt from every worker's KV events: ``BlockStored`` adds
blocks under keys recomputed from the events' token ids, ``BlockRemoved`` drops them,
``AllBlocksCleared``, an engine restart (its event sequence number goes back) and a
resync after lost events drop everything that worker held (`tpuserve_router.kv.kv_events`
does the sequencing). A request's token ids (chat template applied, as the engine
tokenizes them) are cut into pages of the engine's page size, learned from the events.

Per request, as sglang-router's KV-event-fed ``cache_aware_zmq`` (the rule `cache_aware`
also follows, `prefix_routing.choose_by_affinity`, here measured in blocks; `choose_worker`,
compiled, is this rule, and `decide` the whole decision on plain numbers):

1. Imbalanced load (same test and defaults as `cache_aware`: in-flight
   ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``)
   -> the least loaded worker.
2. Else, with ``match`` = the longest run of leading blocks a worker holds over the
   prompt's blocks: if ``match > cache_threshold`` -> the least loaded worker among those
   holding that longest run (``prefix_hit``);
3. else -> the least loaded worker (``miss``).

In 1 and 3, equally loaded workers are told apart by the blocks each caches (reported by its
KV events, or predicted): the fewest wins, the most free cache, as sglang-router's first
``cache_aware`` sent misses to its smallest tree. Workers equal in that too take turns (a
cursor that moves past each one chosen so, not list order). So at low load new
conversations spread over the engines instead of all landing on the first listed (twelve
sequential new prompts over four engines: three each; before, twelve on the first).
4. Then the price of waiting (`prefix_routing.leave_long_queue`, the `cost` policy's idea):
   each worker's prefill work for the request is the prefill already queued there (uncached
   prompt tokens of requests whose prefill is not over: no first byte yet, and the engine's
   KV events have not reported the prompt's last block) plus the prompt tokens it does not
   hold. When the queue the worker with the least work would spare this request (the
   chosen worker's queued prefill minus its own) exceeds ``saved_prefix_weight`` (2) x the
   cached prefix it would give up plus ``queue_margin_tokens`` (8,192: one chunked-prefill
   step), the request goes there instead (``balanced_away`` when it gave up the longest
   prefix). Long prefills then stop queueing behind each
   other on the holder of a prefix (long-context workloads W9 and W10: p99 TTFT from
   1.5-1.8x the oracle's to about its level), while short queues keep affinity (W0-W6,
   W8 unchanged at 0.85 x mu_RR; docs/benchmarks.md).

5. When the chosen worker holds part of the prompt only in host memory (a host tier, SGLang's
   HiCache), HBM room (`room_move`): that part is loaded back into free HBM before the
   prefill, so, as a miss, the request needs room there for all of the prompt the worker
   does not hold in HBM; while it runs it holds its whole prompt's KV. This router counts
   the prompt tokens of the requests it has in flight on each worker (`HbmRoom`, plus those
   its peers announce) against the worker's KV pool (``max_total_num_tokens`` from
   ``/server_info``, `BlockIndex.worker_limit`). When the chosen worker has no room for the
   request and another has, the request goes to the worker with room whose cache saves the
   most (HBM blocks whole, host blocks ``host_hit_weight``: the performance model's prefill
   less load back), then the least loaded. Without it a conversation's holder keeps every
   turn while it has no HBM to run them, and its queue waits on decodes to free room (W4
   with four 16,384-token pools and a host tier: goodput 0.82x the tier-blind router's; with
   it 1.37x, docs/host-kv-tier.md). Prompts held in HBM, and fleets without a host tier,
   route as before.

With a host tier, steps 1-3 weigh what each worker holds by tier (`decide_tiered`, the
compiled `BlockIndex.route`): a block in HBM whole, one only in host memory
``host_hit_weight`` of it. A host block saves only prefill compute: it is loaded into free
HBM as a miss's prompt would be computed there. So it may not buy a busy worker: on a worker
over the load bound of consistent hashing with bounded loads (`prefix_routing.bounded`: with
this request more than ``host_load_factor`` x the fleet's mean in-flight load, `cost`'s rule
and default 1.25) only its HBM blocks count, in the hit test too, and a prompt held only in
the host memory of busy workers is the miss it would be without the tier (the least loaded
worker). Step 5 applies the same bound. Without it a shared prefix never left its holder
once the tier kept it (no miss ever rebalanced the groups of W1: max/mean load 1.09 ->
1.26, goodput at the SLO 0.95x HBM-only; docs/host-kv-tier.md).

The chosen worker's blocks are also *predicted* in the index for
``predicted_ttl_seconds`` (2 s), so a burst of siblings that arrives before the engine's
first ``BlockStored`` still lands together (Dynamo's predict-on-route). A worker that
publishes no events keeps predictions for ``approximate_ttl_seconds`` (120 s), so the
policy degrades to approximate routing rather than to random.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from tpuserve_router import _native
from tpuserve_router.policies.base import (
    Clock,
    Decision,
    NoHealthyWorker,
    Outcome,
    RouteRequest,
    W,
    build_params,
    loads_imbalanced,
    register,
)
from tpuserve_router.policies.failover import MAX_KEYS, Successors, rendezvous
from tpuserve_router.policies.prefix_routing import (
    LOAD_FACTOR,
    AffinityParams,
    BlockIndexPolicy,
    IndexParams,
    QueueParams,
    affinity_outcome,
    bounded,
    leave_long_queue,
    queue_move,
)
from tpuserve_router.policies.shared_prefixes import MAX_ENDS, SharedPrefixes


@dataclass(frozen=True)
class PreciseParams(AffinityParams, IndexParams, QueueParams):
    host_load_factor: float = LOAD_FACTOR
    """The tiered choice's load bound (`prefix_routing.bounded`, `cost`'s rule and default):
    a worker that would carry more than this times the fleet's mean load is not bought by
    blocks it holds only in host memory; there only its HBM blocks count (the module's
    docstring, the tiered choice)."""

    shared_load_factor: float = LOAD_FACTOR
    """A hit on a prefix where prompts branch (a shared system prompt) goes to its holder only
    while the holder is within this times the fleet's mean load (`shared_prefixes`); 0: no
    bound, the affinity rule alone."""
    failover_ttl_seconds: float = 300.0
    """How long the blocks a lost worker held steer its conversations to their successors
    (`failover`); 0: not at all."""
    failover_max_keys: int = MAX_KEYS
    """The most block keys of lost workers remembered, in all (`failover.Successors`)."""
    shared_prefix_ends: int = MAX_ENDS
    """The most match ends `shared_prefixes` remembers (the oldest forgotten first)."""

    def validate(self) -> str | None:
        return (
            AffinityParams.validate(self)
            or IndexParams.validate(self)
            or QueueParams.validate(self)
            or (
                None
                if self.host_load_factor >= 1.0
                else f"host_load_factor={self.host_load_factor} must be >= 1"
            )
            or (
                None
                if self.shared_load_factor == 0 or self.shared_load_factor >= 1.0
                else f"shared_load_factor={self.shared_load_factor} must be 0 (off) or >= 1"
            )
            or (
                None
                if self.failover_ttl_seconds >= 0
                else f"failover_ttl_seconds={self.failover_ttl_seconds} must be >= 0"
            )
            or (
                None
                if self.failover_max_keys >= 1
                else f"failover_max_keys={self.failover_max_keys} must be >= 1"
            )
            or (
                None
                if self.shared_prefix_ends >= 1
                else f"shared_prefix_ends={self.shared_prefix_ends} must be >= 1"
            )
        )


def choose_worker(
    held: Sequence[int],
    prompt_units: int,
    loads: Sequence[int],
    blocks: Sequence[int],
    cursor: int,
    params: AffinityParams,
) -> tuple[int, Outcome, int]:
    """Steps 1-3 (the module's docstring), pure: the index of the worker to use, why, and
    the cursor to pass next time. ``held[i]``: leading blocks of the prompt (``prompt_units``
    whole blocks) worker ``i`` holds; ``loads[i]``: its in-flight requests; ``blocks[i]``: the
    blocks it caches. The compiled rule `BlockIndex.route` runs per request."""
    return _native.choose_worker(
        held, prompt_units, loads, blocks, cursor,
        params.cache_threshold, params.balance_abs_threshold, params.balance_rel_threshold,
    )  # fmt: skip


def room_move(
    depths: Sequence[int],
    device: Sequence[int],
    page_tokens: int,
    prompt_tokens: int,
    chosen: int,
    room: Sequence[float],
    loads: Sequence[int],
    host_hit_weight: float,
    host_load_factor: float = LOAD_FACTOR,
) -> int:
    """Step 5 (the module's docstring), pure: ``chosen``, or the worker the request goes to
    because ``chosen`` has no HBM room for it. ``depths[i]``: leading blocks of the prompt
    worker ``i`` holds in any tier, ``device[i]`` of them in HBM; ``room[i]``: its free HBM
    in tokens (pool less the prompts in flight there); ``loads[i]``: its in-flight requests.
    A worker needs room for the prompt less what it holds in HBM. With no worker having
    room, ``chosen`` (the request waits wherever it goes). As in the tiered choice, host
    blocks count only on a worker within the load bound (`bounded`, ``host_load_factor``)."""
    need = [prompt_tokens - min(d, a) * page_tokens for a, d in zip(depths, device, strict=True)]
    if need[chosen] <= room[chosen]:
        return chosen
    within = bounded(loads, host_load_factor)
    best = -1
    best_key = (0.0, 0)
    for i, (n, r) in enumerate(zip(need, room, strict=True)):
        if n > r:
            continue
        held = min(device[i], depths[i])
        host = (depths[i] - held) * host_hit_weight if within[i] else 0.0
        key = (held + host, -loads[i])
        if best < 0 or key > best_key:
            best, best_key = i, key
    return chosen if best < 0 else best


class HbmRoom:
    """Prompt tokens of the requests routed to each worker that have not ended: the KV they
    hold in its HBM while they run (step 5). A request's tokens come off at its end, or when
    it is set aside before reaching the worker."""

    def __init__(self) -> None:
        self._tokens: dict[str, int] = {}

    def tokens(self, name: str) -> int:
        return self._tokens.get(name, 0)

    def book(self, decision: Decision[Any], tokens: int) -> None:
        if tokens > 0:
            name = decision.worker.name
            self._tokens[name] = self._tokens.get(name, 0) + tokens
            decision.hbm_tokens = tokens

    def release(self, decision: Decision[Any]) -> None:
        if decision.hbm_tokens:
            name = decision.worker.name
            left = self._tokens.get(name, 0) - decision.hbm_tokens
            if left > 0:
                self._tokens[name] = left
            else:
                self._tokens.pop(name, None)
            decision.hbm_tokens = 0

    def keep_only(self, names: Collection[str]) -> None:
        """Forget the workers not in ``names`` (they left)."""
        for name in [n for n in self._tokens if n not in names]:
            del self._tokens[name]


def decide(
    held: Sequence[int],
    page_tokens: int,
    prompt_tokens: int,
    loads: Sequence[int],
    blocks: Sequence[int],
    queued: Sequence[int],
    cursor: int,
    params: PreciseParams,
) -> tuple[int, Outcome, int]:
    """The policy's decision on plain numbers (steps 1-4), as `PrecisePolicy.choose` makes
    it from its index and queues: `choose_worker`, then `queue_move` with ``queued[i]`` the
    prefill tokens queued on worker ``i``. The fleet model (`tpuserve.fleet`) routes
    with it, and with `decide_tiered` once its engines hold host-tier blocks."""
    i, outcome, cursor = choose_worker(
        held, prompt_tokens // page_tokens, loads, blocks, cursor, params
    )
    moved = queue_move(held, page_tokens, prompt_tokens, i, queued, loads, params)
    if moved != i:
        cached = [h * page_tokens for h in held]
        return moved, affinity_outcome(cached, moved, prompt_tokens, params.cache_threshold), cursor
    return i, outcome, cursor


TIER_UNITS = 1000
"""A block in HBM is worth this many units in the tiered choice, a host block
``round(host_hit_weight x TIER_UNITS)`` (``TIER_UNITS`` in `router/native/src/index.rs`)."""


def decide_tiered(
    depths: Sequence[int],
    device: Sequence[int],
    page_tokens: int,
    prompt_tokens: int,
    loads: Sequence[int],
    blocks: Sequence[int],
    queued: Sequence[int],
    room: Sequence[float],
    cursor: int,
    params: PreciseParams,
) -> tuple[int, Outcome, int]:
    """The policy's decision on plain numbers when some worker holds blocks only in host
    memory (steps 1-5), as `PrecisePolicy.choose` makes it then: `BlockIndex.route`'s tiered
    affinity choice (``depths[i]``: leading blocks worker ``i`` holds in any tier,
    ``device[i]`` of them in HBM; a block in HBM is worth `TIER_UNITS`, one only in host
    memory ``host_hit_weight`` of that; a hit when any tier of any worker holds more than
    ``cache_threshold`` of the prompt, or only HBM counts when a host block is worth
    nothing), then `queue_move` on the any-tier depths, then `room_move` (``room[i]``: the
    worker's free HBM in tokens) when the chosen worker would load part of the prompt back.
    A worker over the load bound (`bounded` with ``host_load_factor``) counts only its HBM
    blocks, there as in the hit test: what a host block saves may not buy an overloaded worker.
    The fleet model (`tpuserve.fleet`) routes with it when its engines have a host tier."""
    units = prompt_tokens // page_tokens
    host_units = round(params.host_hit_weight * TIER_UNITS)
    within = bounded(loads, params.host_load_factor)
    held = []
    counted = []
    for a, d, ok in zip(depths, device, within, strict=True):
        dev = min(a, d)
        host = a - dev if host_units > 0 and ok else 0
        held.append(dev * TIER_UNITS + host * host_units)
        counted.append(dev + host)
    is_hit = units > 0 and max(counted) / units > params.cache_threshold
    # `choose_worker` reads the hit from max(held) / prompt units: with 1 unit any held > 0
    # is a hit (a hit implies cache_threshold < 1 and some held >= 1), with 0 none is
    i, outcome, cursor = choose_worker(held, 1 if is_hit else 0, loads, blocks, cursor, params)
    chosen = i
    i = queue_move(depths, page_tokens, prompt_tokens, i, queued, loads, params)
    if device[i] < depths[i]:  # it would load back: HBM room decides (step 5)
        i = room_move(depths, device, page_tokens, prompt_tokens, i, room, loads,
                      params.host_hit_weight, params.host_load_factor)  # fmt: skip
    if i != chosen:
        cached = [d * page_tokens for d in depths]
        outcome = affinity_outcome(cached, i, prompt_tokens, params.cache_threshold)
    return i, outcome, cursor


@register("precise")
class PrecisePolicy(BlockIndexPolicy):
    def __init__(self, *, clock: Clock = time.monotonic, seed: int | None = None, **config: Any):
        self.params = build_params(self.name, PreciseParams, config)
        self.start_index(self.params, clock)
        p = self.params
        self.room = HbmRoom()
        self.successors = Successors(clock, p.failover_ttl_seconds, p.failover_max_keys)
        self.shared = (
            SharedPrefixes(p.shared_load_factor, p.shared_prefix_ends)
            if p.shared_load_factor
            else None
        )
        self.block_index.set_route_params(
            p.cache_threshold, p.balance_abs_threshold, p.balance_rel_threshold,
            p.queue_margin_tokens, p.saved_prefix_weight, p.host_hit_weight,
            p.host_load_factor,
        )  # fmt: skip

    def choose(self, request: RouteRequest, workers: Sequence[W]) -> Decision[W]:
        params = self.params
        index = self.block_index
        tokens = request.token_ids or ()
        prompt = len(tokens)
        booked = self.queues.booked
        # `healthy_workers` and route's inputs in one loop: in Python 3.11 a comprehension, like
        # a call, builds a function object and a frame; with cold caches the loop costs ~110
        # fewer misses per request than the call and three comprehensions (CHANGELOG.md,
        # router CPU pass 11)
        healthy: list[W] = []
        names: list[str] = []
        loads: list[int] = []
        queued: list[int] = []
        for w in workers:
            if w.healthy:
                healthy.append(w)
                name = w.name
                names.append(name)
                loads.append(w.in_flight)
                queued.append(booked.get(name, 0) + w.peer_prefill_tokens)
        if not healthy:
            raise NoHealthyWorker(request.model)
        keys, depths, i, outcome, predicted, page, last_key = index.route(
            tokens, names, loads, queued
        )  # keys are whole pages of the prompt: depth x page <= prompt
        chosen = i
        moved = False
        if self.successors.active or len(healthy) < len(workers):  # something was lost
            successor = self._successor(keys, depths, names, loads, workers)
            if successor is not None:
                i, moved = successor, True
        if not moved and outcome == "prefix_hit" and self.shared is not None:
            depth = depths[i]
            if depth:  # what follows the match: the next block, or the tail past the last one
                whole = depth == len(keys)  # every whole page held: the partial last follows
                following = hash(tuple(tokens[depth * page :])) if whole else keys[depth]
                if self.shared.is_shared(keys[depth - 1], following):
                    i = self.shared.move(depths, loads, i)
                    moved = i != chosen
        if not predicted and not moved:
            i = leave_long_queue(healthy, depths, page, prompt, i, self.queues, params)
        device: list[int] | None = None
        if index.host_only_blocks:  # some engine has a host tier: what of it is where
            device = index.device_match(keys, names)
            if device[i] < depths[i]:  # it would load back: HBM room decides (step 5)
                i = self._room_move(depths, device, page, prompt, i, names, loads)
        if i != chosen:
            cached = [d * page for d in depths]
            outcome = affinity_outcome(cached, i, prompt, params.cache_threshold)
            if predicted:  # route predicted the keys on the worker it chose
                index.unpredict(names[chosen], keys)
                predicted = False
        if not predicted:
            index.predict(names[i], keys)
        target = healthy[i]
        hit = depths[i] * page
        # positional: a call with keywords builds a dict for them (Decision's field order:
        # worker, outcome, predicted_match_ratio, prompt_units, pending_units, block_keys)
        decision = Decision(target, outcome, hit / prompt if prompt else 0.0, prompt, 0, keys)
        if device is not None and hit:  # what of the hit is in host memory there
            decision.predicted_host_ratio = max(0, depths[i] - device[i]) * page / prompt
        self.queues.book(decision, prompt - hit, last_key)
        self.room.book(decision, prompt)
        return decision

    def _successor(
        self,
        keys: Sequence[int],
        depths: Sequence[int],
        names: Sequence[str],
        loads: Sequence[int],
        workers: Sequence[W],
    ) -> int | None:
        """The successor of a prompt whose longest prefix a lost worker held (`failover`):
        remembered from a lost stream, or still indexed on an unhealthy candidate; None when a
        live worker holds as much, when the lost prefix would not have been a hit, or when
        loads are imbalanced (the affinity rule's first test goes first)."""
        successors = self.successors
        successors.expire()
        lost = successors.depth(keys) if successors.active else 0
        gone = [w.name for w in workers if not w.healthy]
        if gone:
            lost = max(lost, *self.block_index.match(keys, gone))
        p = self.params
        if lost <= max(depths) or lost <= p.cache_threshold * len(keys):
            return None
        if loads_imbalanced(loads, p.balance_abs_threshold, p.balance_rel_threshold):
            return None
        successors.chosen += 1
        key = keys[lost - 1]
        by = successors.lost_by(key)  # never back to the worker that lost it (it restarted)
        if by is not None and by in names and len(names) > 1:
            others = [name for name in names if name != by]
            return names.index(others[rendezvous(key, others)])
        return rendezvous(key, names)

    def index_sizes(self) -> dict[str, int]:
        sizes = super().index_sizes()
        sizes["successor_keys"] = len(self.successors)
        sizes["shared_prefix_ends"] = len(self.shared) if self.shared is not None else 0
        return sizes

    def failover_routes(self) -> dict[str, int]:
        spread = self.shared.spread if self.shared is not None else 0
        return {"successor": self.successors.chosen, "shared_prefix_spread": spread}

    def remember_lost(self, name: str, rank: int | None = None) -> None:
        """Worker ``name``'s stream (of DP rank ``rank``; every rank's when None) is about to
        be dropped because the engine died or restarted empty: remember what it held, so its
        conversations go to their successors (`failover`)."""
        if self.params.failover_ttl_seconds <= 0:
            return
        index = self.block_index
        ranks = [rank] if rank is not None else [r for r, _ in index.rank_depths(name, [])]
        for r in ranks:
            self.successors.remember((key for _, key in index.stream_blocks(name, r)), name)

    def _room_move(
        self,
        depths: Sequence[int],
        device: Sequence[int],
        page: int,
        prompt: int,
        chosen: int,
        names: Sequence[str],
        loads: Sequence[int],
    ) -> int:
        """`room_move` on this router's count of each worker's HBM in use (its pool: the
        index's `worker_limit`, unknown pools never full)."""
        index = self.block_index
        room = self.room

        def free(name: str) -> float:
            limit = index.worker_limit(name)
            if limit is None:
                return math.inf
            return limit * page - room.tokens(name)

        need = prompt - min(device[chosen], depths[chosen]) * page
        if need <= free(names[chosen]):
            return chosen  # the usual case: the others' room is read only when it is not
        rooms = [free(name) for name in names]
        p = self.params
        return room_move(
            depths, device, page, prompt, chosen, rooms, loads, p.host_hit_weight,
            p.host_load_factor,
        )  # fmt: skip

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        if decision.pending_units:
            self.queues.release(decision)
        if decision.hbm_tokens:
            self.room.release(decision)

    def on_set_aside(self, decision: Decision[Any]) -> None:
        super().on_set_aside(decision)
        if decision.hbm_tokens:
            self.room.release(decision)

    def apply_peer_route(
        self, decision: Decision[Any], last_key: int | None, keys: Sequence[int]
    ) -> None:
        super().apply_peer_route(decision, last_key, keys)
        self.room.book(decision, len(keys) * self.block_index.page_size)

    def on_workers_changed(self, names: Collection[str]) -> None:
        keep = set(names)
        for name in self.block_index.workers():
            if name not in keep:  # it left (drained, removed): its conversations move on
                self.remember_lost(name)
        super().on_workers_changed(names)
        self.room.keep_only(set(names))
