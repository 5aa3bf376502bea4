"""A fleet on the virtual clock: hundreds of engine replicas, several routers, a day's traffic.

`tpuserve.bench.sim_runner` drives the engine twin's own scheduler token by token behind the
router's own policy objects: exact, and fast enough for 4-16 engines. A fleet of 250 replicas
serving ~10^6 requests an hour needs a coarser engine and routing decisions that do not look
at every replica. This package is that model; `tpuserve plan` and ``bench/fleet_*.py`` run
it. `FleetSim` puts its parts on one clock (`tpuserve.fleet.events.Clock`), each in its own
module, whose docstring states its rules:

- `tpuserve.fleet.traffic`: sessions of the Mooncake shapes (or ``lengths`` requests) on the
  daily shape with bursts;
- `tpuserve.fleet.engines`: continuous batching with chunked prefill, the KV pool and its
  prefix cache (and host tier), each slice's lifecycle and what a load poll reports;
- `tpuserve.fleet.index`: which engine holds which block, as their KV events tell routers;
- `tpuserve.fleet.routers`: router replicas that poll and peer, and decide by the router's own
  decision functions (`tpuserve_router.policies.precise`) and load-view rule
  (`tpuserve_router.engines.load_view`), or by the llm-d and oracle anchors;
- `tpuserve.fleet.autoscaler`: the HPA's rule and behaviour over slices that start cold;
- `tpuserve.fleet.spot`: Spot preemptions (notice, death, a cold start back).

Each part draws from the run's seeded generators in the order the events come, so a seed
gives one run (the goldens, ``bench/goldens.py``, pin it). `run_fleet` returns a
`FleetResult`: tokens, goodput under the SLO (TTFT and mean ITL per request), percentiles,
cache hits, chip-seconds and the wall time.
"""

from __future__ import annotations

import gc
import heapq
import random
import time
import weakref
from typing import cast

from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from tpuserve.fleet.autoscaler import Autoscaler
from tpuserve.fleet.config import FleetConfig, WorkloadRequest
from tpuserve.fleet.engines import READY, STARTING, Engine, Engines
from tpuserve.fleet.events import ARRIVAL, HPA, KILL, NOTICE, POLL, SAMPLE, SESSION, STEP, UP, Clock
from tpuserve.fleet.index import KvIndex
from tpuserve.fleet.request import Request
from tpuserve.fleet.results import FleetResult
from tpuserve.fleet.routers import RouterReplica, Routers
from tpuserve.fleet.spot import Spot
from tpuserve.fleet.traffic import Traffic

SAMPLE_SECONDS = 5.0
"""How often the KV tokens in flight are sampled (`FleetResult.tokens_in_flight_samples`)."""


class FleetSim:
    """One run: the parts (``traffic``, ``slots``, ``index``, ``routing``, ``autoscaler``,
    ``spot``) on one clock, and what happens to each request between them.

    `desired_replicas` and `record_outcome` are hooks for `tpuserve.bench.autoscaling`."""

    def __init__(self, config: FleetConfig) -> None:
        config.validate()
        c = self.config = config
        self.block = c.block_tokens
        shape = c.shape
        profile = c.profile or get_profile(c.model, "model")
        self.chips = shape.chips
        timer = StepTimer(shape, profile, c.quantization, engine=c.engine)
        pool = kv_pool_tokens(shape, profile, c.quantization, engine=c.engine)
        if pool < self.block:
            raise ValueError(
                f"model: {c.model} leaves no KV pool on {c.generation} {c.topology}; allowed: "
                "a model and topology that fit (see `tpuserve plan`)"
            )
        self.context_length = min(profile.context_length, pool)
        self.rng = random.Random(f"fleet:{c.seed}")
        """Traffic, cold starts and Spot draw from it."""
        self.route_rng = random.Random(f"fleet-route:{c.seed}")
        """The routers draw from it (a router per request, candidates, the anchors' ties)."""
        self.clock = Clock()
        self.result = FleetResult(c, 0.0, 0.0)
        host_blocks = c.host_cache_tokens // self.block
        self.index = KvIndex(
            tiered=host_blocks > 0 and not c.tier_blind_routing and c.policy == "precise"
        )
        # The parts call back through a weak proxy: no reference cycle, so reference counting
        # frees a finished run while the cyclic collector is paused (`run`).
        me = cast("FleetSim", weakref.proxy(self))
        self.slots = Engines(c, self.clock, self.rng, timer, pool, self.index, self.result, me)
        self.routing = Routers(c, self.clock, self.route_rng, self.slots, self.index)
        self.traffic = Traffic(c, self.clock, self.rng, self.context_length, me)
        self.autoscaler = Autoscaler(c, self.clock, self.slots, self.result, me)
        self.spot = Spot(c, self.clock, self.rng, self.slots, self.result)
        self.spec_replicas = 0
        self.arrived = 0
        self.opened = False

    # --- views other code reads -----------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.now

    @now.setter
    def now(self, t: float) -> None:
        self.clock.now = t

    @property
    def engines(self) -> list[Engine]:
        return self.slots.engines

    @property
    def routers(self) -> list[RouterReplica]:
        return self.routing.replicas

    @property
    def wait(self) -> list[int]:
        """Waiting requests per engine, as a load poll reports them."""
        return self.slots.wait

    @property
    def wtok(self) -> list[int]:
        """Uncached prompt tokens waiting per engine, as a load poll reports them."""
        return self.slots.wtok

    def rate_multiplier(self, t: float) -> float:
        """The arrival rate at ``t`` relative to ``peak_rate``: daily shape x bursts."""
        return self.traffic.rate_multiplier(t)

    # --- hooks ----------------------------------------------------------------------------

    def desired_replicas(self, current: int) -> int:
        """The autoscaler's desired replica count before the min/max bounds: the HPA's rule on
        ``tokensInFlight``. `tpuserve.bench.autoscaling` overrides it with other rules."""
        return self.autoscaler.tokens_in_flight_rule(current)

    def record_outcome(self, arrival: float, good: bool) -> None:
        """Called once per counted request as it ends (``good``: within the SLO; a failed
        request is not good). A hook for `tpuserve.bench.autoscaling`; nothing here."""

    # --- runs -----------------------------------------------------------------------------

    def run(self) -> FleetResult:
        """Run the window and the drain. The cyclic garbage collector is paused meanwhile:
        the model makes no reference cycles it needs collected (reference counting frees
        every request and engine state; a unit test checks it), and with ~10^6 live objects
        its collections took ~12 % of the time."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def requests(self, limit: int) -> list[WorkloadRequest]:
        """The workload's first ``limit`` requests in arrival order (fewer if the window ends
        first), drawn and not served: a turn's arrival does not depend on how the one before
        was served. Call it on a fresh model, instead of `run`."""
        traffic = self.traffic
        drawn = traffic.drawn = []
        clock = self.clock
        try:
            traffic.next_session(0.0)
            events = clock.events
            while events and len(drawn) < limit:
                t, _, kind, a, b = heapq.heappop(events)
                clock.now = t
                if kind == SESSION:
                    traffic.start_session()
                    traffic.next_session(t)
                elif kind == ARRIVAL:
                    traffic.turn(a, b)
        finally:
            traffic.drawn = None
        return drawn

    def session_requests(self, limit: int) -> list[WorkloadRequest]:
        """Whole sessions' requests, the sessions drawn one after the other (not on the
        arrival process), until at least ``limit`` requests: the workload's mix of prompts and
        outputs. Call it on a fresh model, instead of `run`."""
        traffic = self.traffic
        drawn = traffic.drawn = []
        clock = self.clock
        try:
            while len(drawn) < limit:
                traffic.start_session()
                while clock.events:  # the session's later turns
                    t, _, kind, a, b = heapq.heappop(clock.events)
                    if kind == ARRIVAL:
                        clock.now = t
                        traffic.turn(a, b)
        finally:
            traffic.drawn = None
        return drawn

    def choose(self, blocks: tuple[int, ...], prompt_tokens: int, router: int = 0) -> int:
        """The engine router ``router`` would send a request for ``blocks`` arriving now to,
        by the configured policy, as `run` decides (what it books and predicts included); the
        request is not served. Brings the initial replicas up first."""
        self._open()
        req = Request(self.clock.now, blocks, prompt_tokens, 1, 0)
        return self.routing.route(self.routing.replicas[router], req)[0]

    def cache(self, engine: int, blocks: tuple[int, ...]) -> None:
        """Engine ``engine`` caches ``blocks`` now, as when a prefill of them ends there."""
        self.slots.insert(self.slots.engines[engine], blocks, 0)

    def _open(self) -> None:
        """Bring the initial replicas up (once)."""
        if self.opened:
            return
        self.opened = True
        c = self.config
        initial = c.initial_replicas if c.initial_replicas is not None else c.replicas
        for i in range(initial):
            self.slots.set_state(self.slots.engines[i], READY)
            self.spot.schedule(self.slots.engines[i])
        self.spec_replicas = initial
        self.result.replicas_min = self.result.replicas_max = initial

    def _run(self) -> FleetResult:
        c = self.config
        start = time.perf_counter()
        self._open()
        clock, traffic, slots, spot = self.clock, self.traffic, self.slots, self.spot
        traffic.next_session(0.0)
        if c.router_replicas and c.load_poll_seconds > 0 and c.policy != "round_robin":
            for r in range(c.router_replicas):
                clock.push(r * c.load_poll_seconds / c.router_replicas, POLL, r, 0)
        if c.autoscale:
            clock.push(c.hpa_interval_seconds, HPA, None, 0)
        clock.push(c.warmup_seconds + SAMPLE_SECONDS, SAMPLE, None, 0)
        duration = c.duration_seconds
        end = duration + c.drain_seconds
        events = clock.events
        engines = slots.engines
        pop = heapq.heappop
        step = slots.step
        count = 0
        while events:
            t, _, kind, a, b = pop(events)
            if t > end:
                break
            if t > duration and kind in (POLL, HPA) and not slots.busy():
                break
            count += 1
            clock.now = t
            if kind == STEP:
                e = engines[a]
                if b == e.version:
                    step(e)
            elif kind == SESSION:
                if self.arrived < c.max_requests:
                    traffic.start_session()
                    traffic.next_session(t)
            elif kind == ARRIVAL:
                traffic.turn(a, b)
            elif kind == POLL:
                self.routing.poll(a)
                if t <= duration or slots.busy():
                    clock.push(t + c.load_poll_seconds, POLL, a, 0)
            elif kind == HPA:
                self.autoscaler.decide()
                if t <= duration:
                    clock.push(t + c.hpa_interval_seconds, HPA, None, 0)
            elif kind == SAMPLE:
                metric = slots.tokens_in_flight_per_chip()
                if metric is not None:
                    self.result.tokens_in_flight_samples.append(metric)
                if t + SAMPLE_SECONDS <= duration:
                    clock.push(t + SAMPLE_SECONDS, SAMPLE, None, 0)
            elif kind == UP:
                e = engines[a]
                if e.incarnation == b and e.state == STARTING:
                    slots.set_state(e, READY)
                    spot.schedule(e)
            elif kind == NOTICE:
                spot.notice(a, b)
            elif kind == KILL:
                spot.kill(a, b)
        slots.account_chips(min(clock.now, duration))
        res = self.result
        res.unfinished = sum(
            1 for e in engines for r in e.requests() if r.arrival >= c.warmup_seconds
        )
        res.wall_seconds = time.perf_counter() - start
        res.virtual_seconds = clock.now
        res.events = count
        return res

    # --- a request between the parts -----------------------------------------------------

    def arrive(self, req: Request) -> None:
        """The traffic's request reaches a router, which sends it to an engine."""
        self.arrived += 1
        if req.arrival >= self.config.warmup_seconds:
            self.result.requests += 1
        slots = self.slots
        if not slots.ready:
            self.failed(req)
            return
        target = self.routing.send(req)
        slots.submit(slots.engines[target], req)

    def released(self, req: Request, first: bool) -> None:
        self.routing.release(req, first)

    def engine_gone(self, engine: int) -> None:
        self.routing.forget_engine(engine)

    def completed(self, req: Request) -> None:
        """Count a finished request (after the warmup) and whether it met the SLO."""
        c = self.config
        if req.arrival < c.warmup_seconds:
            return
        res = self.result
        ttft = req.first - req.arrival
        itl = (self.clock.now - req.first) / (req.output - 1) if req.output > 1 else 0.0
        res.completed += 1
        res.input_tokens += req.prompt
        res.output_tokens += req.output
        res.cached_tokens += req.cached
        res.host_cached_tokens += req.host_cached
        res.ttft.append(ttft)
        res.itl.append(itl)
        res.request_seconds += self.clock.now - req.arrival
        good = ttft <= c.slo_ttft_seconds and itl <= c.slo_itl_seconds
        if good:
            res.good_requests += 1
            res.good_input_tokens += req.prompt
            res.good_output_tokens += req.output
        self.record_outcome(req.arrival, good)

    def failed(self, req: Request) -> None:
        if req.arrival >= self.config.warmup_seconds:
            self.result.failed += 1
            self.record_outcome(req.arrival, False)


def run_fleet(config: FleetConfig) -> FleetResult:
    return FleetSim(config).run()
