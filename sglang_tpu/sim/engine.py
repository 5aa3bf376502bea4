"""The engine twin's core: continuous batching over a radix cache, timed by the TPU model.

One core, two clocks. `EngineCore` holds all behaviour (admission, radix cache, chunked
prefill, decode, memory accounting, retraction, KV events, output tokens) and never reads a
clock: a driver calls ``begin_step(now)`` to form a batch and learn how long it takes, then
``finish_step(step, now)`` when that time has passed. `VirtualEngine` (below) drives it on a
virtual clock for benchmarks; `sglang_tpu.sim.server` drives the same core on the event
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

Virtual-clock API (what a benchmark uses)::

    core = EngineCore(EngineConfig(cache_tokens=200_000, page_size=16), timer, palette)
    sim = VirtualEngine(core)
    sim.submit(Request("r1", token_ids, max_new_tokens=64), at=0.0)
    done = sim.run_until(10.0)            # list[Completion]: ttft, e2e, cached_tokens, ...
    core.match_prefix_length(token_ids)   # oracle view of the cache, no side effects
    core.num_running, core.num_waiting, core.token_usage
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_tpu.kv_events import KVEvent
from sglang_tpu.perf_model import StepTimer
from sglang_tpu.sim.radix_cache import RadixCache, TreeNode
from sglang_tpu.tokenizer import Tokenizer

_MASK64 = (1 << 64) - 1
_LCG_A = 6364136223846793005
_LCG_C = 1442695040888963407
# Share of a running request's remaining output the scheduler keeps free in the KV pool
# before admitting more (SGLang's new_token_ratio, which it adapts between 0.1 and 0.7).
NEW_TOKEN_RESERVE_RATIO = 0.3
RESERVE_CLIP_TOKENS = 4096

PALETTE_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " was", " with",
    " be", " by", " on", " not", " he", " this", " are", " or", " his", " from", " at",
    " which", " but", " have", " an", " had", " they", " you", " were", " their", " one",
    " all", " we", " can", " her", " has", " there", " been", " if", " more", " when",
    " will", " would", " who", " so", " no", " out", " up", " into", " that", " time",
    " new", " some", " them", " two", " may", " only", " over", " such", " our", " any",
    " most", " made", " after", " first", " also", " did", " many", " way", " well", " year",
)  # fmt: skip


class QueueFull(Exception):
    """The waiting queue is at --max-queued-requests; the caller answers 503."""


class OutputPalette:
    """One-token words of a tokenizer from which output tokens are drawn."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        ids: list[int] = []
        texts: list[str] = []
        seen: set[int] = set()
        for word in PALETTE_WORDS:
            encoded = tokenizer.encode(word)
            if (
                len(encoded) == 1
                and encoded[0] not in seen
                and encoded[0] != tokenizer.eos_token_id
                and tokenizer.decode(encoded) == word
            ):
                seen.add(encoded[0])
                ids.append(encoded[0])
                texts.append(word)
        if not ids:  # an unusual vocabulary: fall back to any decodable non-EOS ids
            for token_id in range(min(tokenizer.vocab_size, 512)):
                if token_id != tokenizer.eos_token_id:
                    ids.append(token_id)
                    texts.append(tokenizer.decode([token_id]))
                if len(ids) >= 64:
                    break
        self.ids = ids
        self.texts = texts
        self.text_of = dict(zip(ids, texts, strict=True))


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


class Request:
    """One generation request as the core sees it; the driver reads the public fields."""

    __slots__ = (
        "_rng",
        "arrival_time",
        "cached_tokens",
        "finish_reason",
        "finish_time",
        "first_token_time",
        "input_ids",
        "last_node",
        "last_token_time",
        "max_new_tokens",
        "on_update",
        "output_ids",
        "prefill_len",
        "prefilled",
        "private_tokens",
        "retractions",
        "rid",
        "sampling_seed",
        "schedule_time",
        "stop_strings",
        "stop_text_index",
        "stop_token_ids",
        "stream",
        "text",
        "tree_len",
        "user",
    )

    def __init__(
        self,
        rid: str,
        input_ids: Sequence[int],
        max_new_tokens: int,
        *,
        stop_strings: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        sampling_seed: int | None = None,
        on_update: Callable[[Request], None] | None = None,
        user: Any = None,
        stream: bool = False,
    ) -> None:
        self.rid = rid
        self.input_ids = list(input_ids)
        self.max_new_tokens = max_new_tokens
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.sampling_seed = sampling_seed
        self.on_update = on_update
        self.user = user
        self.stream = stream  # the client streams the output (SGLang's `is_streaming` label)
        self.output_ids: list[int] = []
        self.text: list[str] = []  # output text pieces, kept only when stop strings are set
        self.stop_text_index: int | None = None  # where a matched stop string starts
        self.arrival_time = 0.0
        self.schedule_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time = 0.0
        self.finish_time: float | None = None
        self.finish_reason: dict[str, Any] | None = None
        self.cached_tokens = 0
        self.prefilled = 0
        self.prefill_len = 0  # tokens to prefill: len(fill_ids()) when admitted
        self.tree_len = 0
        self.private_tokens = 0
        self.retractions = 0
        self.last_node: TreeNode | None = None
        self._rng = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def fill_ids(self) -> list[int]:
        """Tokens whose KV the request needs (prompt, plus output after a retraction)."""
        return self.input_ids + self.output_ids if self.output_ids else self.input_ids


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request's timings and token counts (times on the driver's clock)."""

    rid: str
    arrival_time: float
    schedule_time: float
    first_token_time: float
    finish_time: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: dict[str, Any]
    retractions: int

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def queue_time(self) -> float:
        return self.schedule_time - self.arrival_time


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


class EngineObserver(Protocol):
    """Hooks the HTTP server uses to keep Prometheus metrics; the virtual clock needs none."""

    def on_scheduled(self, req: Request, now: float) -> None: ...

    def on_step(self, step: Step, now: float) -> None: ...

    def on_token(self, req: Request, now: float, interval: float | None) -> None: ...

    def on_finish(self, req: Request, now: float) -> None: ...

    def on_abort(self, req: Request, now: float) -> None: ...


class EngineCore:
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
        self.cache = RadixCache(config.page_size, emit_events=config.emit_kv_events)
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

    def match_prefix_length(self, token_ids: Sequence[int]) -> int:
        """Tokens of `token_ids` the cache holds now (no side effects)."""
        return self.cache.peek_prefix_length(token_ids)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    @property
    def step_in_flight(self) -> bool:
        return self._step is not None

    # --- requests -----------------------------------------------------------------------

    def add_request(self, req: Request, now: float) -> None:
        if len(self.waiting) >= self.config.max_queued_requests:
            raise QueueFull(
                f"the waiting queue holds {len(self.waiting)} requests "
                f"(--max-queued-requests {self.config.max_queued_requests})"
            )
        req.arrival_time = now
        seed = req.sampling_seed
        if seed is None:
            tail = tuple(req.input_ids[-32:])
            seed = hash(tail) ^ (len(req.input_ids) << 32)
        req._rng = (seed * _LCG_A + self.config.seed * 0x9E3779B97F4A7C15 + 1) & _MASK64
        self.waiting.append(req)

    def next_sampling_seed(self) -> int:
        """A fresh seed for requests sampled with temperature > 0 and no seed of their own."""
        self._seed_counter += 1
        return self._seed_counter * 0x2545F4914F6CDD1D

    def abort(self, req: Request, now: float) -> bool:
        """Drop a request (client went away); returns False when it already finished."""
        if req.finished:
            return False
        if req in self.waiting:
            self.waiting.remove(req)
        elif req is self.chunked:
            self.chunked = None
        elif req in self.running:
            self.running.remove(req)
        if self._step is not None:
            self._step.decode = [r for r in self._step.decode if r is not req]
            self._step.prefill = [(r, n) for r, n in self._step.prefill if r is not req]
        self._release(req)
        req.finish_reason = {"type": "abort", "message": "client disconnected"}
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
                return self._prefill_step(now, items, attention, cached_in_step)
            self.chunked = None
            self.running.append(req)  # rejoins the decode set after this step
        headroom = self._free_tokens() + self.cache.evictable_size - self._reserved_for_running()
        while self.waiting and budget > 0 and self.num_running < cfg.max_running_requests:
            req = self.waiting[0]
            fill = req.fill_ids()
            prefix, node = self.cache.match_prefix(fill[: len(fill) - 1])
            extend = len(fill) - prefix
            reserve = NEW_TOKEN_RESERVE_RATIO * min(
                req.max_new_tokens - len(req.output_ids), RESERVE_CLIP_TOKENS
            )
            take = extend if extend <= budget else int(budget) // page * page
            if take <= 0:
                break
            if headroom < take + reserve and (self.running or items):
                break
            self.cache.inc_lock_ref(node)  # before evicting, so the match survives
            if not self._ensure_free(take):
                self.cache.dec_lock_ref(node)
                break
            self.waiting.popleft()
            headroom -= take + reserve
            req.last_node = node
            req.tree_len = prefix
            req.prefilled = prefix
            req.prefill_len = len(fill)
            if req.schedule_time is None:
                req.schedule_time = now
                req.cached_tokens = prefix
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
        return self._prefill_step(now, items, attention, cached_in_step)

    def _prefill_step(
        self, now: float, items: list[tuple[Request, int]], attention: int, cached: int
    ) -> Step:
        tokens = 0
        for req, take in items:
            req.private_tokens += take
            tokens += take
        self.private_tokens += tokens
        duration = self.timer.step_seconds(
            prefill_tokens=tokens, prefill_attention_context=attention
        )
        return Step(
            "prefill", now, duration, prefill=items, prefill_compute_tokens=tokens,
            prefill_cached_tokens=cached,
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
        pal = self.palette
        x = (req._rng * _LCG_A + _LCG_C) & _MASK64
        req._rng = x
        token = pal.ids[(x >> 33) % len(pal.ids)]
        req.output_ids.append(token)
        self.generated_tokens_total += 1
        interval = None
        if req.first_token_time is None:
            req.first_token_time = now
        else:
            interval = now - req.last_token_time
        req.last_token_time = now
        if req.stop_strings:
            piece = pal.text_of.get(token, "")
            req.text.append(piece)
            self._check_stop_strings(req, piece)
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

    def _check_stop_strings(self, req: Request, piece: str) -> None:
        longest = max(len(s) for s in req.stop_strings)
        tail_pieces: list[str] = []
        size = 0
        for p in reversed(req.text):
            tail_pieces.append(p)
            size += len(p)
            if size >= longest + len(piece):
                break
        tail = "".join(reversed(tail_pieces))
        total = sum(len(p) for p in req.text) if len(tail_pieces) < len(req.text) else len(tail)
        offset = total - len(tail)
        best: tuple[int, str] | None = None
        for stop in req.stop_strings:
            idx = tail.find(stop)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is not None:
            req.stop_text_index = offset + best[0]
            req.finish_reason = {"type": "stop", "matched": best[1]}

    def output_text(self, req: Request) -> str:
        """The request's output text so far, cut before a matched stop string."""
        if req.stop_strings:
            text = "".join(req.text)
        else:
            text_of = self.palette.text_of
            text = "".join([text_of.get(t, "") for t in req.output_ids])
        if req.stop_text_index is not None:
            return text[: req.stop_text_index]
        return text

    def _emit_kv_events(self) -> None:
        if not self.config.emit_kv_events:
            return
        events = self.cache.take_events()
        if events and self.kv_event_sink is not None:
            self.kv_event_sink(events)

    def completion(self, req: Request) -> Completion:
        assert req.finish_reason is not None
        assert req.finish_time is not None
        return Completion(
            rid=req.rid,
            arrival_time=req.arrival_time,
            schedule_time=req.schedule_time if req.schedule_time is not None else req.arrival_time,
            first_token_time=req.first_token_time
            if req.first_token_time is not None
            else req.finish_time,
            finish_time=req.finish_time,
            prompt_tokens=len(req.input_ids),
            cached_tokens=req.cached_tokens,
            completion_tokens=len(req.output_ids),
            finish_reason=req.finish_reason,
            retractions=req.retractions,
        )


class VirtualEngine:
    """Drives an EngineCore on a virtual clock: submit arrivals, advance, read completions."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.now = 0.0
        self._arrivals: list[tuple[float, int, Request]] = []
        self._seq = 0
        self._step = None  # type: Step | None
        self._step_end = math.inf
        self.rejected: list[tuple[float, Request]] = []

    def submit(self, req: Request, at: float) -> None:
        """Schedule `req` to arrive at virtual time `at` (not before the current time)."""
        self._seq += 1
        heapq.heappush(self._arrivals, (max(at, self.now), self._seq, req))

    @property
    def idle(self) -> bool:
        return not self._arrivals and self._step is None and not self.core.has_work()

    def run_until(self, until: float) -> list[Completion]:
        """Advance to `until` (or the last event before it); completions finished meanwhile."""
        core = self.core
        arrivals = self._arrivals
        done: list[Completion] = []
        while True:
            while arrivals and arrivals[0][0] <= self.now:
                at, _, req = heapq.heappop(arrivals)
                try:
                    core.add_request(req, at)
                except QueueFull:
                    self.rejected.append((at, req))
            if self._step is None and core.has_work():
                step = core.begin_step(self.now)
                if step is not None:
                    self._step = step
                    self._step_end = self.now + step.duration
            next_arrival = arrivals[0][0] if arrivals else math.inf
            next_time = min(next_arrival, self._step_end)
            if next_time > until or next_time == math.inf:
                if until != math.inf:
                    self.now = max(self.now, until)
                return done
            self.now = next_time
            if self._step is not None and self._step_end <= next_arrival:
                step, self._step, self._step_end = self._step, None, math.inf
                for req in core.finish_step(step, self.now):
                    done.append(core.completion(req))

    def run_to_completion(self) -> list[Completion]:
        return self.run_until(math.inf)
