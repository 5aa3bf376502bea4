"""The engine twin's core: continuous batching over a radix cache, timed by the TPU model.

One core, two clocks. `EngineCore` holds all behaviour (admission, radix cache, chunked
prefill, decode, memory accounting, retraction, KV events, output tokens) and never reads a
clock: a driver calls ``begin_step(now)`` to form a batch and learn how long it takes, then
``finish_step(step, now)`` when that time has passed. `sglang_tpu.sim.virtual_clock` drives it
on a virtual clock for benchmarks; `sglang_tpu.sim.service` drives the same core on the event
loop's clock for the HTTP server.

Scheduling follows SGLang's default scheduler:

- a waiting queue (FCFS) bounded by ``max_queued_requests`` (`QueueFull` beyond it);
- each step is either a *prefill* batch or a *decode* batch. A prefill batch continues the
  one request being chunk-prefilled, then admits waiting requests while the running count
  stays under ``max_running_requests``, the step's token budget ``chunked_prefill_size``
  lasts (the request that does not fit is cut at a page boundary and continued next step)
  and the KV pool has room for its new tokens plus a reservation for future output;
- at admission a request's prompt (all but its last token, as SGLang matches) is matched
  against the radix cache: ``cached_tokens`` is that match and its nodes are locked;
- after a prefill the prompt's whole pages are inserted into the cache and the first output
  token is produced; a decode step produces one token per running request; a finished
  request inserts prompt + output (all but the last token) and unlocks;
- when the pool is full, unlocked leaves are evicted (LRU); when a decode step still lacks
  room the most recently admitted request is retracted to the front of the queue.

Output tokens are deterministic pseudo-text: a per-request LCG over a palette of one-token
words of the tokenizer, seeded from the engine seed, the prompt and the request's seed. The
twin never samples EOS: a request runs to ``max_new_tokens`` unless a stop string or stop
token id matches.

Output tokens are deterministic pseudo-text (`sglang_tpu.sim.output_text`); requests and
their finished records are `sglang_tpu.sim.request`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from sglang_tpu.kv_events import KVEvent
from sglang_tpu.perf_model import StepTimer
from sglang_tpu.sim.output_text import OutputPalette, next_token, record_text, seed_output
from sglang_tpu.sim.radix_cache import RadixCache
from sglang_tpu.sim.request import Request

# Share of a running request's remaining output the scheduler keeps free in the KV pool
# before admitting more (SGLang's new_token_ratio, which it adapts between 0.1 and 0.7).
NEW_TOKEN_RESERVE_RATIO = 0.3
RESERVE_CLIP_TOKENS = 4096

# How SGLang 0.5.23 finishes an aborted request (``/abort_request``, or its client gone): a
# running one with the scheduler's ``FINISH_ABORT().to_json()``, a queued one with the
# tokenizer manager's reason for it. Its OpenAI answer says ``finish_reason: "abort"``.
ABORTED_RUNNING: Final[Mapping[str, Any]] = {
    "type": "abort", "message": "Aborted", "status_code": None, "err_type": None,
}  # fmt: skip
ABORTED_WAITING: Final[Mapping[str, Any]] = {"type": "abort", "message": "Abort in waiting queue"}


class QueueFull(Exception):
    """The waiting queue is at --max-queued-requests; the caller answers 503."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    cache_tokens: int
    page_size: int = 16
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192  # <= 0 disables chunking (whole prompts per step)
    max_queued_requests: int = 4096
    context_length: int = 131072
    seed: int = 0
    emit_kv_events: bool = False
    # The host-memory tier (SGLang's HiCache): its size in tokens (0: none) and write policy.
    host_cache_tokens: int = 0
    write_policy: str = "write_through"
    # SGLang-JAX (pinned commit) loads a host hit back only into free device slots, all or
    # nothing, and never evicts for it (`schedule_policy.py` 685, `unified_radix_cache.py`
    # 1094): a longer host hit is computed again. SGLang evicts for it (False).
    load_back_free_only: bool = False


@dataclass(slots=True)
class Step:
    """One scheduler iteration in flight: a prefill or a decode batch and its duration."""

    kind: str  # "prefill" | "decode"
    start: float
    duration: float
    prefill: list[tuple[Request, int]] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    prefill_compute_tokens: int = 0
    prefill_cached_tokens: int = 0
    prefill_host_tokens: int = 0  # of the cached ones, loaded back from the host tier
    load_back_seconds: float = 0.0


class EngineObserver(Protocol):
    """Hooks the HTTP server uses to keep Prometheus metrics; the virtual clock needs none."""

    def on_scheduled(self, req: Request, now: float) -> None: ...

    def on_step(self, step: Step, now: float) -> None: ...

    def on_token(self, req: Request, now: float, interval: float | None) -> None: ...

    def on_finish(self, req: Request, now: float) -> None: ...

    def on_abort(self, req: Request, now: float) -> None: ...


class EngineCore:
    """SGLang's scheduler over a radix cache; a driver supplies the clock (see above)."""

    def __init__(
        self,
        config: EngineConfig,
        timer: StepTimer,
        palette: OutputPalette,
        *,
        observer: EngineObserver | None = None,
        kv_event_sink: Callable[[list[KVEvent]], None] | None = None,
    ) -> None:
        self.config = config
        self.timer = timer
        self.palette = palette
        self.observer = observer
        self.kv_event_sink = kv_event_sink
        self.cache = RadixCache(
            config.page_size,
            emit_events=config.emit_kv_events,
            host_tokens=config.host_cache_tokens,
            write_policy=config.write_policy,
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.chunked: Request | None = None
        self.private_tokens = 0
        self.retracted_total = 0
        self._step: Step | None = None
        self._seed_counter = 0
        self.generated_tokens_total = 0  # for gen_throughput
        self.last_prefill_hit_rate = 0.0

    # --- inspection (oracle routers, /get_load, metrics) --------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_used_tokens(self) -> int:
        """KV slots in use, as SGLang counts them: all but the evictable cache."""
        return self.cache.protected_size + self.private_tokens

    @property
    def token_usage(self) -> float:
        return self.num_used_tokens / self.config.cache_tokens

    @property
    def waiting_prompt_tokens(self) -> int:
        return sum(len(r.input_ids) for r in self.waiting)

    @property
    def waiting_uncached_tokens(self) -> int:
        """Prompt tokens waiting for prefill compute, as SGLang 0.5.23's ``/v1/loads`` counts
        ``num_waiting_uncached_tokens``: each waiting request's tokens past its matched prefix,
        plus what the chunked request has left to prefill. As SGLang keeps a waiting request's
        ``num_matched_prefix_tokens`` from its last match, the twin matches a waiting request
        once (the first time it is asked) rather than on every call."""
        peek = self.cache.peek_prefix_length
        total = 0
        for req in self.waiting:
            fill = req.fill_ids()
            matched = req.matched_prefix_tokens
            if matched is None:
                matched = req.matched_prefix_tokens = min(len(fill), peek(fill))
            total += len(fill) - matched
        chunked = self.chunked
        if chunked is not None:
            total += max(0, chunked.prefill_len - chunked.prefilled)
        return total

    def match_prefix_length(self, token_ids: Sequence[int]) -> int:
        """Tokens of `token_ids` the cache holds now (no side effects)."""
        return self.cache.peek_prefix_length(token_ids)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    # --- requests -----------------------------------------------------------------------

    def add_request(self, req: Request, now: float) -> None:
        if len(self.waiting) >= self.config.max_queued_requests:
            raise QueueFull(
                f"the waiting queue holds {len(self.waiting)} requests "
                f"(--max-queued-requests {self.config.max_queued_requests})"
            )
        req.arrival_time = now
        seed_output(req, self.config.seed)
        self.waiting.append(req)

    def add_transferred(self, req: Request, arrived: float, now: float) -> None:
        """A decode engine's request whose prompt KV came from a prefill engine: it joins the
        running batch prefilled, with its first token (the prefill's: the same pseudo-text)
        at ``now``, as SGLang's decode scheduler admits a transferred request."""
        req.arrival_time = arrived
        seed_output(req, self.config.seed)
        fill = req.fill_ids()
        self._ensure_free(len(fill))  # SGLang preallocated it; a full pool retracts later
        req.private_tokens += len(fill)
        self.private_tokens += len(fill)
        req.prefilled = req.prefill_len = len(fill)
        req.schedule_time = now
        if self.observer is not None:
            self.observer.on_scheduled(req, now)
        self._append_token(req, now)
        if req.finished:
            self._cache_finished(req)
            if self.observer is not None:
                self.observer.on_finish(req, now)
            if req.on_update is not None:
                req.on_update(req)
            return
        self.running.append(req)

    def next_sampling_seed(self) -> int:
        """A fresh seed for requests sampled with temperature > 0 and no seed of their own."""
        self._seed_counter += 1
        return self._seed_counter * 0x2545F4914F6CDD1D

    def abort(self, req: Request, now: float) -> bool:
        """Drop a request (its client went away, or ``/abort_request`` named it); returns
        False when it already finished. It finishes as SGLang 0.5.23's abort leaves it: a
        queued request with its tokenizer manager's reason, a running one with the
        scheduler's ``FINISH_ABORT``."""
        if req.finished:
            return False
        reason = ABORTED_RUNNING
        if req in self.waiting:
            self.waiting.remove(req)
            reason = ABORTED_WAITING
        elif req is self.chunked:
            self.chunked = None
        elif req in self.running:
            self.running.remove(req)
        if self._step is not None:
            self._step.decode = [r for r in self._step.decode if r is not req]
            self._step.prefill = [(r, n) for r, n in self._step.prefill if r is not req]
        self._release(req)
        req.finish_reason = dict(reason)
        req.finish_time = now
        if self.observer is not None:
            self.observer.on_abort(req, now)
        return True

    def flush_cache(self) -> bool:
        """Empty the radix cache (AllBlocksCleared); refused while requests are in flight."""
        if self.has_work() or self._step is not None:
            return False
        self.cache.reset()
        self._emit_kv_events()
        return True

    # --- memory -------------------------------------------------------------------------

    def _free_tokens(self) -> int:
        return self.config.cache_tokens - self.cache.total_size - self.private_tokens

    def _ensure_free(self, tokens: int) -> bool:
        free = self._free_tokens()
        if free < tokens:
            self.cache.evict(tokens - free)
            free = self._free_tokens()
        return free >= tokens

    def _reserved_for_running(self) -> float:
        reqs = self.running if self.chunked is None else [*self.running, self.chunked]
        return NEW_TOKEN_RESERVE_RATIO * sum(
            min(r.max_new_tokens - len(r.output_ids), RESERVE_CLIP_TOKENS) for r in reqs
        )

    def _release(self, req: Request) -> None:
        if req.last_node is not None:
            self.cache.dec_lock_ref(req.last_node)
            req.last_node = None
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0
        req.tree_len = 0
        req.prefilled = 0
        req.prefill_len = 0

    # --- stepping -----------------------------------------------------------------------

    def begin_step(self, now: float) -> Step | None:
        """Form the next batch at `now`; None when there is nothing to run."""
        if self._step is not None:
            raise RuntimeError("begin_step called while a step is in flight")
        step = self._form_prefill(now)
        if step is None and self.running:
            step = self._form_decode(now)
        self._step = step
        return step

    def _form_prefill(self, now: float) -> Step | None:
        cfg = self.config
        budget = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else math.inf
        page = cfg.page_size
        items: list[tuple[Request, int]] = []
        attention = 0
        cached_in_step = 0
        loaded = 0  # host-tier tokens loaded back before this step's prefill
        if self.chunked is not None:
            req = self.chunked
            remaining = req.prefill_len - req.prefilled
            take = remaining if remaining <= budget else int(budget) // page * page
            if take <= 0:
                return None
            items.append((req, take))
            attention += take * req.prefilled + take * (take + 1) // 2
            budget -= take
            if take < remaining:
                return self._prefill_step(now, items, attention, cached_in_step, loaded)
            self.chunked = None
            self.running.append(req)  # rejoins the decode set after this step
        headroom = self._free_tokens() + self.cache.evictable_size - self._reserved_for_running()
        while self.waiting and budget > 0 and self.num_running < cfg.max_running_requests:
            req = self.waiting[0]
            fill = req.fill_ids()
            if self.cache.tiered:
                prefix, host, node = self.cache.match_prefix_tiers(fill[: len(fill) - 1])
                if host and cfg.load_back_free_only and host > self._free_tokens():
                    while not node.on_device:  # compute the host part again (SGLang-JAX)
                        assert node.parent is not None
                        node = node.parent
                    host = 0
            else:
                (prefix, node), host = self.cache.match_prefix(fill[: len(fill) - 1]), 0
            extend = len(fill) - prefix - host
            reserve = NEW_TOKEN_RESERVE_RATIO * min(
                req.max_new_tokens - len(req.output_ids), RESERVE_CLIP_TOKENS
            )
            take = extend if extend <= budget else int(budget) // page * page
            if take <= 0:
                break
            if headroom < take + host + reserve and (self.running or items):
                break
            self.cache.inc_lock_ref(node)  # before evicting, so the match survives
            if not self._ensure_free(take + host):
                self.cache.dec_lock_ref(node)
                break
            self.waiting.popleft()
            headroom -= take + host + reserve
            if host:  # SGLang loads the host part back to HBM before the prefill
                loaded += self.cache.load_back(node)
                prefix += host
            req.last_node = node
            req.tree_len = prefix
            req.prefilled = prefix
            req.prefill_len = len(fill)
            if req.schedule_time is None:
                req.schedule_time = now
                req.cached_tokens = prefix
                req.cached_host_tokens = host
                if self.observer is not None:
                    self.observer.on_scheduled(req, now)
            cached_in_step += prefix
            items.append((req, take))
            attention += take * prefix + take * (take + 1) // 2
            budget -= take
            if take < extend:
                self.chunked = req
                break
            self.running.append(req)
        if not items:
            return None
        # Running requests admitted this step decode only from the next step on.
        return self._prefill_step(now, items, attention, cached_in_step, loaded)

    def _prefill_step(
        self,
        now: float,
        items: list[tuple[Request, int]],
        attention: int,
        cached: int,
        loaded: int = 0,
    ) -> Step:
        tokens = 0
        for req, take in items:
            req.private_tokens += take
            tokens += take
        self.private_tokens += tokens
        load_back = self.timer.load_back_seconds(loaded)
        duration = load_back + self.timer.step_seconds(
            prefill_tokens=tokens, prefill_attention_context=attention
        )
        return Step(
            "prefill", now, duration, prefill=items, prefill_compute_tokens=tokens,
            prefill_cached_tokens=cached, prefill_host_tokens=loaded,
            load_back_seconds=load_back,
        )  # fmt: skip

    def _form_decode(self, now: float) -> Step | None:
        prefilled = [r for r in self.running if r.prefilled >= r.prefill_len]
        while prefilled and not self._ensure_free(len(prefilled)):
            victim = prefilled.pop()
            self._retract(victim)
        if not prefilled:
            return None
        context = 0
        for req in prefilled:
            req.private_tokens += 1
            context += len(req.input_ids) + len(req.output_ids)
        self.private_tokens += len(prefilled)
        duration = self.timer.step_seconds(decode_batch=len(prefilled), decode_context=context)
        return Step("decode", now, duration, decode=prefilled)

    def _retract(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.retractions += 1
        self.retracted_total += 1
        req.matched_prefix_tokens = None  # waits again: matched again when asked
        self.waiting.appendleft(req)

    def finish_step(self, step: Step, now: float) -> list[Request]:
        """Apply a step's effects at `now`; returns the requests that finished."""
        if step is not self._step:
            raise RuntimeError("finish_step called with a step that is not in flight")
        self._step = None
        finished: list[Request] = []
        obs = self.observer
        if step.kind == "prefill":
            total = step.prefill_compute_tokens + step.prefill_cached_tokens
            self.last_prefill_hit_rate = step.prefill_cached_tokens / total if total else 0.0
            for req, take in step.prefill:
                req.prefilled += take
                self._cache_unfinished(req, req.fill_ids()[: req.prefilled])
                if req.prefilled >= req.prefill_len:
                    self._append_token(req, now)
                    if req.finished:
                        finished.append(req)
                elif req.on_update is not None:
                    req.on_update(req)
        else:
            for req in step.decode:
                self._append_token(req, now)
                if req.finished:
                    finished.append(req)
        for req in finished:
            if req in self.running:
                self.running.remove(req)
            self._cache_finished(req)
            if obs is not None:
                obs.on_finish(req, now)
            if req.on_update is not None:
                req.on_update(req)
        if obs is not None:
            obs.on_step(step, now)
        self._emit_kv_events()
        return finished

    def _cache_unfinished(self, req: Request, tokens: list[int]) -> None:
        cache = self.cache
        cache.insert(tokens)
        aligned, node = cache.match_prefix(tokens)
        moved = aligned - req.tree_len
        req.private_tokens -= moved
        self.private_tokens -= moved
        req.tree_len = aligned
        cache.inc_lock_ref(node)
        if req.last_node is not None:
            cache.dec_lock_ref(req.last_node)
        req.last_node = node

    def _cache_finished(self, req: Request) -> None:
        fill = req.input_ids + req.output_ids
        self.cache.insert(fill[: len(fill) - 1])
        self._release(req)

    def _append_token(self, req: Request, now: float) -> None:
        token = next_token(req, self.palette)
        req.output_ids.append(token)
        self.generated_tokens_total += 1
        interval = None
        if req.first_token_time is None:
            req.first_token_time = now
        else:
            interval = now - req.last_token_time
        req.last_token_time = now
        record_text(req, token, self.palette)
        if req.finish_reason is None:
            if token in req.stop_token_ids:
                req.finish_reason = {"type": "stop", "matched": token}
            elif len(req.output_ids) >= req.max_new_tokens:
                req.finish_reason = {"type": "length", "length": req.max_new_tokens}
        if req.finish_reason is not None:
            req.finish_time = now
        if self.observer is not None:
            self.observer.on_token(req, now, interval)
        if req.on_update is not None and req.finish_reason is None:
            req.on_update(req)

    def _emit_kv_events(self) -> None:
        if not self.config.emit_kv_events:
            return
        events = self.cache.take_events()
        if events and self.kv_event_sink is not None:
            self.kv_event_sink(events)
