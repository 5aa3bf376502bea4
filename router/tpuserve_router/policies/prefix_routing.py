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

`PrefillQueues` keeps the prefill work routed to each worker and not started yet (the uncached
prompt tokens of requests whose first byte has not come back); `cost` prices every worker with
it, and `precise` uses it to overrule the affinity rule where that rule would queue a request
far behind other prefills (`leave_long_queue`, on the pure `queue_move`).

`precise` runs its own form of the affinity rule, compiled (`precise.choose_worker`): a miss
is not broken by ``miss_key`` and list order but by the fewest cached blocks, then in turns.

`precise` and `cost` own a `BlockIndex` fed by the workers' KV events: `IndexParams` are its
parameters, `make_index` builds it, and `BlockIndexPolicy` forgets a worker's blocks when the
worker is reset or leaves, and asks the router for KV events and token ids.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tpu.perf_model import DEFAULT_PROFILE, StepTimer, get_profile
from sglang_tpu.topology import lookup
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.policies.base import (
    Clock,
    Decision,
    Outcome,
    PolicyDefaults,
    W,
    in_flight_of,
    loads_imbalanced,
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
    best = max(held)
    is_hit = prompt_units > 0 and best / prompt_units > params.cache_threshold
    loads = [w.in_flight for w in healthy]  # (the request path: no key functions, one pass each)
    least = min(loads)
    if len(loads) > 1 and loads_imbalanced(
        loads, params.balance_abs_threshold, params.balance_rel_threshold
    ):
        target = loads.index(least)
        if not is_hit:
            return target, "miss"
        return target, "prefix_hit" if held[target] == best else "balanced_away"
    if is_hit:
        target = held.index(best)
        for i in range(target + 1, len(held)):
            if held[i] == best and loads[i] < loads[target]:
                target = i
        return target, "prefix_hit"
    if miss_key is in_flight_of:
        return loads.index(least), "miss"
    return min(range(len(healthy)), key=lambda i: miss_key(healthy[i])), "miss"


def affinity_outcome(
    held: Sequence[int], target: int, prompt_units: int, cache_threshold: float
) -> Outcome:
    """Why ``target`` was chosen, as `choose_by_affinity` labels it: ``miss`` when no worker
    holds more than ``cache_threshold`` of the prompt, ``prefix_hit`` when ``target`` holds
    the longest prefix, else ``balanced_away``."""
    best = max(held)
    if prompt_units <= 0 or best / prompt_units <= cache_threshold:
        return "miss"
    return "prefix_hit" if held[target] == best else "balanced_away"


class PrefillQueues:
    """Prefill work routed to each worker that has not finished: the uncached prompt tokens of
    the requests sent there whose prefill is not over (SGLang prefills before it decodes, so
    this is the work ahead of a new request there).

    `book` adds a request's tokens and records them on its decision; they come off once
    (`release`), at the first of: its first byte, its end, or, given the policy's block
    index, the engine reporting the prompt's last full block (its KV events confirm the
    prefill is over, which for a request that is not streamed comes long before its first
    byte). Prefills finish in the order they were routed (SGLang serves its queue first come,
    first served), so only the oldest of a worker's requests is checked against the index.
    """

    def __init__(self, index: BlockIndex | None = None) -> None:
        self._tokens: dict[str, int] = {}
        self.booked: Mapping[str, int] = self._tokens
        """Tokens booked per worker, before releasing the prefills its index shows are over
        (`tokens` does): upper bounds of the queues. (An attribute, not a property: it is read
        per request, and a property's getter is one more Python frame.)"""
        self._index = index
        self._waiting: dict[str, deque[tuple[Decision[Any], int]]] = {}

    def tokens(self, name: str) -> int:
        waiting = self._waiting.get(name)
        if waiting:
            index = self._index
            while waiting:
                decision, last_key = waiting[0]
                if decision.pending_units and not (index and index.holds(name, last_key)):
                    break
                waiting.popleft()
                self.release(decision)
        return self._tokens.get(name, 0)

    def book(self, decision: Decision[Any], tokens: int, last_key: int | None = None) -> None:
        """Count ``tokens`` on the decision's worker; ``last_key`` is the block index key of
        the prompt's last full block (its confirmation ends the prefill)."""
        if tokens > 0:
            name = decision.worker.name
            self._tokens[name] = self._tokens.get(name, 0) + tokens
            decision.pending_units = tokens
            if self._index is not None and last_key is not None:
                waiting = self._waiting.get(name)
                if waiting is None:  # (not setdefault: it would build a deque per booking)
                    waiting = self._waiting[name] = deque()
                while waiting and not waiting[0][0].pending_units:  # released meanwhile
                    waiting.popleft()  # (`tokens` may not be asked between two bookings)
                waiting.append((decision, last_key))

    def release(self, decision: Decision[Any]) -> None:
        if decision.pending_units:
            name = decision.worker.name
            left = self._tokens.get(name, 0) - decision.pending_units
            if left > 0:
                self._tokens[name] = left
            else:
                self._tokens.pop(name, None)
            decision.pending_units = 0

    def keep_only(self, names: Collection[str]) -> None:
        """Forget the workers not in ``names`` (they left)."""
        keep = set(names)
        for name in list(self._tokens):
            if name not in keep:
                del self._tokens[name]
        for name in list(self._waiting):
            if name not in keep:
                del self._waiting[name]


LOAD_FACTOR = 1.25
"""The load bound of consistent hashing with bounded loads (`bounded`): how far above the
fleet's mean load a worker may be and still be bought by what it caches. `cost`'s
``load_factor`` and `precise`'s ``host_load_factor`` default to it: one meaning of an
overloaded worker for both policies."""


def bounded(loads: Sequence[int], load_factor: float) -> list[bool]:
    """Whether each worker is within the load bound of consistent hashing with bounded loads:
    with this request it would carry at most ``load_factor`` times the mean,
    ``loads[i] + 1 <= ceil(load_factor * (sum(loads) + 1) / n)`` (`cost`'s candidates; the
    least loaded worker always is). `affinity::bounded` in router/native is the same rule."""
    cap = math.ceil(load_factor * (sum(loads) + 1) / max(1, len(loads)))
    return [load + 1 <= cap for load in loads]


@dataclass(frozen=True)
class QueueParams:
    """When `leave_long_queue` overrules the affinity rule."""

    saved_prefix_weight: float = 2.0
    """Queued tokens a move must avoid per token of cached prefix it gives up (``inf``:
    never move). A token of prefix given up is prefilled again at the other worker, and
    every request queued there after this one waits for it too: hence more than 1."""
    queue_margin_tokens: int = 8192
    """... plus this many: one step of SGLang's default chunked prefill, so a move saves at
    least a whole prefill step (with 4,096 the synthetic Mooncake conversations of W7 lost
    balance: p99 E2E 8.0 -> 14.7 s)."""

    def validate(self) -> str | None:
        if not self.saved_prefix_weight >= 0.0:
            return f"saved_prefix_weight={self.saved_prefix_weight} must be >= 0"
        if self.queue_margin_tokens < 0:
            return f"queue_margin_tokens={self.queue_margin_tokens} must be >= 0"
        return None


def leave_long_queue(
    healthy: Sequence[W],
    held: Sequence[int],
    unit_tokens: int,
    prompt_tokens: int,
    chosen: int,
    queues: PrefillQueues,
    params: QueueParams,
) -> int:
    """`queue_move` on the workers' queues: ``chosen``, or the worker that would start this
    prompt's first token much sooner. A worker's queue is the prefill queued there, booked by
    this router, plus what other router replicas queued as of the last load poll."""
    target = healthy[chosen]
    if queues.tokens(target.name) + target.peer_prefill_tokens <= (
        params.queue_margin_tokens
        + params.saved_prefix_weight * unit_tokens * (held[chosen] - max(held))
    ):
        return chosen  # no move could avoid more than the chosen worker's whole queue
    # (the usual case, decided on the chosen worker's queue alone: the others' are read only
    # when a move is possible, and reading one only releases prefills that are over)
    queued = [queues.tokens(w.name) + w.peer_prefill_tokens for w in healthy]
    loads = [w.in_flight for w in healthy]
    return queue_move(held, unit_tokens, prompt_tokens, chosen, queued, loads, params)


def queue_move(
    held: Sequence[int],
    unit_tokens: int,
    prompt_tokens: int,
    chosen: int,
    queued: Sequence[int],
    loads: Sequence[int],
    params: QueueParams,
) -> int:
    """``chosen``, or the worker that would start this prompt's first token much sooner (pure:
    `leave_long_queue` and the fleet model call it).

    ``held[i]`` is the leading blocks of ``unit_tokens`` worker ``i`` holds, ``queued[i]``
    the prefill tokens queued there, ``loads[i]`` its in-flight requests. A worker's prefill
    work for the request is its queue plus the prompt's tokens it does not hold
    (``prompt_tokens - cached[i]``, `cost`'s price, ``cached[i] = held[i] * unit_tokens``).
    The candidate is the worker with the least work (ties: the longer prefix, then the least
    loaded). The request moves there when the queue it avoids outweighs the prefix it gives
    up: when ``queued[chosen] - queued[candidate]`` exceeds ``saved_prefix_weight`` x
    ``(cached[chosen] - cached[candidate])`` plus ``queue_margin_tokens``. So a long prefill
    queued on a prefix's holder no longer holds up the requests that follow it there, while
    short queues keep affinity (a move costs a prefill, which the requests queued behind it
    at the other worker pay for too, and room in that worker's cache).
    """
    if queued[chosen] <= params.queue_margin_tokens + params.saved_prefix_weight * unit_tokens * (
        held[chosen] - max(held)
    ):
        return chosen  # no move could avoid more than the chosen worker's whole queue
    cached = [h * unit_tokens for h in held]
    work = [q + prompt_tokens - c for q, c in zip(queued, cached, strict=True)]
    least = min(range(len(held)), key=lambda i: (work[i], -cached[i], loads[i]))
    avoided = queued[chosen] - queued[least]
    given_up = cached[chosen] - cached[least]
    if avoided > params.saved_prefix_weight * given_up + params.queue_margin_tokens:
        return least
    return chosen


HOST_HIT_WEIGHT = round(
    StepTimer(lookup("v6e", "1x1"), get_profile(DEFAULT_PROFILE)).host_hit_value(), 3
)
"""`IndexParams.host_hit_weight`'s default: what a token in an engine's host-memory tier saves
against one in HBM (its prefill less its load back, `StepTimer.host_hit_value`) for the engine
twin's default slice and model (v6e 1x1, Llama-3.1-8B: about 0.2; a v5e's slower prefill makes
it about 0.8). Set it for the fleet's slice with the policy parameter."""


@dataclass(frozen=True)
class IndexParams:
    """Parameters of a policy's `BlockIndex` (see `tpuserve_router.kv.block_index`).

    ``host_hit_weight``: what a block an engine holds only in host memory (KV events with a
    medium other than ``GPU``, SGLang's HiCache) is worth against one in its HBM when the
    policy compares workers, 0..1: an HBM hit beats a host hit beats a miss, and a prefix any
    tier holds is never routed as a miss."""

    page_size: int = 16
    predicted_ttl_seconds: float = 2.0
    approximate_ttl_seconds: float = 120.0
    max_predicted_blocks: int = 2**18
    host_hit_weight: float = HOST_HIT_WEIGHT

    def validate(self) -> str | None:
        if self.page_size < 1:
            return f"page_size={self.page_size} must be >= 1"
        if self.predicted_ttl_seconds < 0:
            return f"predicted_ttl_seconds={self.predicted_ttl_seconds} must be >= 0"
        if self.approximate_ttl_seconds < 0:
            return f"approximate_ttl_seconds={self.approximate_ttl_seconds} must be >= 0"
        if self.max_predicted_blocks < 0:
            return f"max_predicted_blocks={self.max_predicted_blocks} must be >= 0"
        if not 0.0 <= self.host_hit_weight <= 1.0:
            return f"host_hit_weight={self.host_hit_weight} must be within [0, 1]"
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
    """A policy routing on a `BlockIndex`, with the `PrefillQueues` that read it: it needs the
    prompt's token ids, the router feeds the index with the workers' KV events, a request's
    queued prefill comes off when its prefill or the request is over, and a worker's blocks
    and queue go when it is reset or leaves. Peer replicas' decisions are predicted and
    booked as its own (`apply_peer_route`)."""

    needs_tokens = True
    uses_kv_events = True
    block_index: BlockIndex
    queues: PrefillQueues

    def start_index(self, params: IndexParams, clock: Clock) -> None:
        """Build the block index and the prefill queues (called by the policy's ``__init__``)."""
        self.block_index = make_index(params, clock)
        self.queues = PrefillQueues(self.block_index)

    def on_prefill_done(self, decision: Decision[Any]) -> None:
        if decision.pending_units:  # (a call less per request: the second hook finds none)
            self.queues.release(decision)

    def on_request_done(self, decision: Decision[Any], succeeded: bool) -> None:
        if decision.pending_units:
            self.queues.release(decision)

    def on_set_aside(self, decision: Decision[Any]) -> None:
        if decision.pending_units:
            self.queues.release(decision)
        if decision.block_keys:  # the worker will not get the prompt: nor predict it there
            self.block_index.unpredict(decision.worker.name, decision.block_keys)

    def queued_prefill_tokens(self, name: str) -> int:
        return self.queues.tokens(name)

    def apply_peer_route(
        self, decision: Decision[Any], last_key: int | None, keys: Sequence[int]
    ) -> None:
        self.block_index.predict(decision.worker.name, keys)
        tokens, decision.pending_units = decision.pending_units, 0
        self.queues.book(decision, tokens, last_key)

    def on_worker_reset(self, name: str) -> None:
        self.block_index.clear(name)

    def on_workers_changed(self, names: Collection[str]) -> None:
        keep = set(names)
        for name in self.block_index.workers():
            if name not in keep:
                self.block_index.forget(name)
        self.queues.keep_only(keep)
