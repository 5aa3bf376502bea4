"""The fleet model's engines: one per replica slot, continuous batching on the virtual clock.

Each engine runs SGLang's loop at a coarser grain: each step prefills up to
``chunked_prefill_size`` uncached prompt tokens (FIFO, several requests packed into one step)
and decodes one token for every running request; step times come from the calibrated
performance model (`sglang_tpu.perf_model.StepTimer`, the twin's). Between two events (an
arrival, a prefill step, the next request to finish) the batch is fixed, so ``k`` decode
steps take a closed-form time (step time is affine in the context read) and the engine jumps
to its next event. Admission reserves prompt + output tokens of the KV pool and at most
``max_running_requests``; the rest of the pool is an LRU prefix cache of blocks, children
evicted before parents, published to the routers' index (`tpuserve.fleet.index`) as KV events
would be; with a host tier, evicted blocks are demoted to a host LRU and loaded back at the
catalog's host-to-device bandwidth before the prefill that hits them.

`Engines` also keeps each slice's lifecycle (off, starting, ready, draining, noticed), the
chips held and what a load poll reports (``load``, ``wait``, ``wtok``). It tells the fleet
what happens to requests through an `EngineListener`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from typing import Any, Protocol

from sglang_tpu.perf_model import StepTimer
from tpuserve.fleet.config import FleetConfig
from tpuserve.fleet.events import STEP, UP, Clock
from tpuserve.fleet.index import KvIndex, depth, hold, unhold
from tpuserve.fleet.request import Request
from tpuserve.fleet.results import FleetResult

# Engine states.
OFF, STARTING, READY, DRAINING, NOTICED = 0, 1, 2, 3, 4


class EngineListener(Protocol):
    """What the engines tell the rest of the fleet about requests."""

    def released(self, req: Request, first: bool) -> None:
        """The router that sent ``req`` hears its first token (``first``) or its end."""

    def completed(self, req: Request) -> None:
        """``req`` finished (its last token now)."""

    def failed(self, req: Request) -> None:
        """``req`` failed (its slice died, or none took it)."""

    def engine_gone(self, engine: int) -> None:
        """Engine ``engine``'s slice is gone (its cache with it)."""


class Engine:
    __slots__ = (
        "both", "cache", "ctx_p", "ctx_s", "host", "i", "incarnation", "load_back", "phase_b",
        "phase_c0", "phase_k", "phase_t0", "prefill", "prefill_step", "reserved", "run", "seq",
        "state", "steps", "t", "version", "waiting", "wtok",
    )  # fmt: skip

    def __init__(self, i: int) -> None:
        self.i = i
        self.state = OFF
        self.incarnation = 0
        self.reset()

    def reset(self) -> None:
        self.t = 0.0
        self.steps = 0
        self.run: list[tuple[int, int, Request]] = []  # (finish step, seq, request)
        self.seq = 0
        self.ctx_p = 0
        self.ctx_s = 0
        self.waiting: deque[Request] = deque()
        self.prefill: list[list[Any]] = []  # [request, tokens left]
        self.prefill_step: list[tuple[Request, int]] | None = None  # the step in progress
        self.reserved = 0
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.host: OrderedDict[int, None] = OrderedDict()  # the host tier's blocks, LRU first
        self.both = 0  # blocks in both (counted for tiered routing only)
        self.load_back = 0.0  # seconds of load back the next prefill step does first
        self.version = 0
        self.phase_k = 0  # decode steps in the phase in progress (0: none)
        self.phase_t0 = 0.0
        self.phase_b = 0
        self.phase_c0 = 0
        self.wtok = 0  # uncached prompt tokens waiting or prefilling

    def requests(self) -> list[Request]:
        """The requests it holds: waiting, prefilling, decoding."""
        return list(self.waiting) + [p[0] for p in self.prefill] + [r for _, _, r in self.run]


class Engines:
    """The replica slots of one slice shape and model."""

    def __init__(
        self,
        config: FleetConfig,
        clock: Clock,
        rng: random.Random,
        timer: StepTimer,
        pool: int,
        index: KvIndex,
        result: FleetResult,
        listener: EngineListener,
    ) -> None:
        c = self.config = config
        self.clock = clock
        self.rng = rng
        self.timer = timer
        self.pool = pool
        """KV pool tokens per engine (`perf_model.kv_pool_tokens`)."""
        self.index = index
        self.result = result
        self.listener = listener
        self.block = c.block_tokens
        self.chips = c.shape.chips
        self.host_blocks = c.host_cache_tokens // self.block
        # Decode steps are affine in the context read: step(b, C) = a[b] + s x C.
        self.decode_a = [
            timer.step_seconds(decode_batch=b) for b in range(c.max_running_requests + 1)
        ]
        probe = 1_000_000
        one = timer.step_seconds(decode_batch=1, decode_context=probe)
        self.decode_s = (one - self.decode_a[1]) / probe
        self.prefill_budget = c.chunked_prefill_size
        self.max_running = c.max_running_requests
        n = c.replicas
        self.engines = [Engine(i) for i in range(n)]
        self.ready: list[int] = []
        self.ready_pos: dict[int, int] = {}
        # What the engines report to a load poll, kept current as they change.
        self.load = [0] * n  # running + waiting
        self.wait = [0] * n  # waiting (not yet running)
        self.wtok = [0] * n  # uncached prompt tokens waiting
        self.chips_held = 0
        self.chips_since = 0.0

    # --- lifecycle ------------------------------------------------------------------------

    def busy(self) -> bool:
        return any(e.run or e.waiting or e.prefill for e in self.engines)

    def live(self) -> list[Engine]:
        """Slices that count as replicas: starting, serving, noticed."""
        return [e for e in self.engines if e.state in (STARTING, READY, NOTICED)]

    def serving(self) -> list[Engine]:
        return [e for e in self.engines if e.state == READY]

    def tokens_in_flight_per_chip(self) -> float | None:
        """KV tokens reserved per serving chip (the ``tokensInFlight`` metric); None when
        nothing serves."""
        serving = self.serving()
        if not serving:
            return None
        return sum(e.reserved for e in serving) / (len(serving) * self.chips)

    def account_chips(self, t: float) -> None:
        c = self.config
        lo = max(self.chips_since, c.warmup_seconds)
        hi = min(t, c.duration_seconds)
        if hi > lo:
            self.result.chip_seconds += self.chips_held * (hi - lo)
        self.chips_since = max(self.chips_since, t)

    def set_state(self, e: Engine, state: int) -> None:
        held_before = e.state != OFF
        if e.state == READY and state != READY:
            pos = self.ready_pos.pop(e.i)
            last = self.ready.pop()
            if last != e.i:
                self.ready[pos] = last
                self.ready_pos[last] = pos
        if state == READY and e.state != READY:
            self.ready_pos[e.i] = len(self.ready)
            self.ready.append(e.i)
        e.state = state
        held = state != OFF
        if held != held_before:
            self.account_chips(self.clock.now)
            self.chips_held += self.chips if held else -self.chips
        n = sum(1 for x in self.engines if x.state in (STARTING, READY, NOTICED))
        res = self.result
        res.replicas_min = min(res.replicas_min, n)
        res.replicas_max = max(res.replicas_max, n)

    def start(self, e: Engine) -> None:
        """A cold start: the slice serves after a time drawn from ``cold_start_seconds``."""
        lo, hi = self.config.cold_start_seconds
        e.incarnation += 1
        e.reset()
        self.set_state(e, STARTING)
        self.clock.push(self.clock.now + self.rng.uniform(lo, hi), UP, e.i, e.incarnation)

    def kill(self, e: Engine) -> None:
        """The slice is gone: fail what it held, forget its cache."""
        listener = self.listener
        for r in e.requests():
            listener.released(r, first=False)
            listener.failed(r)
        self.index.forget(e.i, e.cache, e.host)
        listener.engine_gone(e.i)
        e.version += 1
        e.reset()
        self.load[e.i] = self.wait[e.i] = self.wtok[e.i] = 0
        self.set_state(e, OFF)

    def maybe_off(self, e: Engine) -> None:
        """A draining slice with nothing left goes."""
        if e.state == DRAINING and not (e.run or e.waiting or e.prefill):
            self.kill(e)

    # --- serving --------------------------------------------------------------------------

    def submit(self, e: Engine, req: Request) -> None:
        if e.state not in (READY, DRAINING, NOTICED):
            self.listener.released(req, first=False)
            self.listener.failed(req)
            return
        if e.phase_k:
            self._interrupt(e)
        elif not (e.run or e.prefill or e.waiting):
            e.t = self.clock.now
        e.waiting.append(req)
        req.uncached = req.prompt
        e.wtok += req.prompt
        i = e.i
        self.load[i] += 1
        self.wait[i] += 1
        self.wtok[i] = e.wtok
        if e.prefill_step is None:
            self._schedule(e)

    def _decode_time(self, k: float, b: int, c0: int) -> float:
        """Time of ``k`` decode steps of batch ``b`` starting at context ``c0``."""
        s = self.decode_s
        return k * (self.decode_a[b] + s * c0) + s * b * k * (k - 1) / 2.0

    def _interrupt(self, e: Engine) -> None:
        """A request arrived during a decode phase: end the phase at the step in progress."""
        dt = self.clock.now - e.phase_t0
        b, c0, k = e.phase_b, e.phase_c0, e.phase_k
        s = self.decode_s
        lin = self.decode_a[b] + s * c0 - s * b / 2.0
        quad = s * b / 2.0
        x = (-lin + math.sqrt(lin * lin + 4 * quad * dt)) / (2 * quad) if quad > 0 else dt / lin
        done = min(k, max(1, math.ceil(x - 1e-9)))
        e.t = e.phase_t0 + self._decode_time(done, b, c0)
        e.steps += done
        e.phase_k = 0
        e.version += 1
        self._finish_done(e)

    def _schedule(self, e: Engine) -> None:
        """Plan the engine's next event from its state at ``e.t``."""
        e.version += 1
        e.phase_k = 0
        if e.waiting:
            self._admit(e)
        prefill = e.prefill
        clock = self.clock
        if prefill:
            budget = self.prefill_budget
            batch: list[tuple[Request, int]] = []
            tokens = 0
            attention = 0
            for req, left in prefill:
                take = left if left < budget else budget
                done = req.prompt - left
                batch.append((req, take))
                tokens += take
                attention += take * done + take * (take + 1) // 2
                budget -= take
                if budget <= 0:
                    break
            b = len(e.run)
            ctx = e.ctx_p + b * e.steps - e.ctx_s
            dt = self.timer.step_seconds(tokens, attention, b, ctx) + e.load_back
            e.load_back = 0.0
            e.prefill_step = batch
            clock.seq += 1  # `Clock.push`, inline
            heapq.heappush(clock.events, (e.t + dt, clock.seq, STEP, e.i, e.version))
        elif e.run:
            b = len(e.run)
            k = e.run[0][0] - e.steps
            c0 = e.ctx_p + b * e.steps - e.ctx_s
            e.phase_k, e.phase_t0, e.phase_b, e.phase_c0 = k, e.t, b, c0
            clock.seq += 1
            heapq.heappush(
                clock.events, (e.t + self._decode_time(k, b, c0), clock.seq, STEP, e.i, e.version)
            )
        elif e.state == DRAINING and not e.waiting:
            self.kill(e)

    def _admit(self, e: Engine) -> None:
        pool = self.pool
        limit = self.max_running
        waiting = e.waiting
        run = e.run
        prefill = e.prefill
        cache = e.cache
        block = self.block
        i = e.i
        while waiting:
            req = waiting[0]
            need = req.prompt + req.output
            if len(run) + len(prefill) >= limit or (e.reserved + need > pool and (run or prefill)):
                return
            waiting.popleft()
            self.wait[i] -= 1
            e.reserved += need
            blocks = req.blocks
            # Children are evicted before parents (`_insert`), so a held block's parents
            # are held: the hit is a binary search.
            lo, hi = 0, len(blocks) if cache else 0  # `index.depth` over the cache, inline
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if blocks[mid - 1] in cache:
                    lo = mid
                else:
                    hi = mid - 1
            d = req.depth = lo
            if d:
                move = cache.move_to_end
                for b in blocks[d - 1 :: -1]:
                    move(b)
            host = e.host
            h = d
            while h < len(blocks) and blocks[h] in host:  # the rest of the hit, from host
                h += 1
            if h > d:  # touched children first: parents stay the freshest, as in HBM (SGLang
                touch = host.move_to_end  # evicts host-only leaves, never a parent first)
                for b in blocks[h - 1 : d - 1 : -1] if d else blocks[h - 1 :: -1]:
                    touch(b)
            cached = min(h * block, req.prompt - 1)
            req.host_cached = loaded = max(0, cached - d * block)
            if loaded:
                e.load_back += self.timer.load_back_seconds(loaded)
            req.cached = cached
            e.wtok -= cached
            req.uncached = req.prompt - cached
            self.wtok[i] = e.wtok
            prefill.append([req, req.prompt - cached])

    def step(self, e: Engine) -> None:
        """The engine's event is due: a prefill step or a decode phase ended."""
        e.t = self.clock.now
        if e.prefill_step is not None:
            batch, e.prefill_step = e.prefill_step, None
            e.steps += 1
            finished = 0
            for _req, take in batch:
                entry = e.prefill[finished]  # the batch is the queue's head, in order
                entry[1] -= take
                e.wtok -= take
                if entry[1] <= 0:
                    finished += 1
            self.wtok[e.i] = e.wtok
            if finished:
                done, e.prefill = e.prefill[:finished], e.prefill[finished:]
                for entry in done:
                    self._first_token(e, entry[0])
        else:
            e.steps += e.phase_k
            e.phase_k = 0
        self._finish_done(e)
        self._schedule(e)

    def _first_token(self, e: Engine, req: Request) -> None:
        req.first = self.clock.now
        self.listener.released(req, first=True)
        self.insert(e, req.blocks, req.depth)
        if req.output <= 1:
            self._complete(e, req)
            return
        e.seq += 1
        heapq.heappush(e.run, (e.steps + req.output - 1, e.seq, req))
        e.ctx_p += req.prompt + 1
        e.ctx_s += e.steps

    def insert(self, e: Engine, blocks: tuple[int, ...], hint: int) -> None:
        """Cache ``blocks`` on ``e``, children first (parents are the freshest), then evict
        the least recently used blocks beyond what the pool leaves free; the index hears
        both, as the engine's KV events tell the routers.

        The blocks ``e`` already holds are a prefix of ``blocks`` (a holder of a block holds
        its parents), so the new ones are added from the last, then the held ones are moved
        to the end from the last: the same order as touching every block from the last to
        the first, without asking the cache about each. ``hint``: the held prefix at
        admission, still right unless blocks came or went since (two lookups tell)."""
        cache = e.cache
        index = self.index
        holders = index.holders
        get = holders.get
        i = e.i
        n = len(blocks)
        d = hint
        if (d and blocks[d - 1] not in cache) or (d < n and blocks[d] in cache):
            d = depth(blocks, cache.__contains__)
        tiered = index.tiered
        host_now = e.host
        for b in blocks[: d - 1 : -1] if d else blocks[::-1]:
            cache[b] = None
            if tiered and b in host_now:
                e.both += 1
            h = get(b)
            if h is None:
                holders[b] = i
            elif isinstance(h, int):
                second = {h}
                second.add(i)
                holders[b] = second
            else:
                h.add(i)
        if d:
            move = cache.move_to_end
            for b in blocks[d - 1 :: -1]:
                move(b)
        excess = len(cache) - max(0, self.pool - e.reserved) // self.block
        if excess > 0:
            pop = cache.popitem
            host = e.host if self.host_blocks else None
            for _ in range(excess):
                old = pop(last=False)[0]
                if host is not None:  # demoted to the host tier (its LRU end)
                    if tiered:
                        if old in host:
                            e.both -= 1
                        else:
                            hold(index.host_holders, old, i)
                    host[old] = None
                    host.move_to_end(old)
                    if len(host) > self.host_blocks:
                        gone = host.popitem(last=False)[0]
                        if tiered:
                            unhold(index.host_holders, gone, i)
                            if gone in cache:
                                e.both -= 1
                h = get(old)
                if isinstance(h, int):
                    del holders[old]
                elif h is not None:
                    h.discard(i)
                    if not h:
                        del holders[old]

    def _finish_done(self, e: Engine) -> None:
        run = e.run
        steps = e.steps
        while run and run[0][0] <= steps:
            finish, _, req = heapq.heappop(run)
            e.ctx_p -= req.prompt + 1
            e.ctx_s -= finish - req.output + 1  # the step it joined at
            self._complete(e, req)
        if not run:
            e.ctx_p = e.ctx_s = 0

    def _complete(self, e: Engine, req: Request) -> None:
        e.reserved -= req.prompt + req.output
        self.load[e.i] -= 1
        self.listener.released(req, first=False)
        self.listener.completed(req)
