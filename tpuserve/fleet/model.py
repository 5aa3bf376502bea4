"""A fleet on the virtual clock: hundreds of engine replicas, several routers, a day's traffic.

`tpuserve.bench.sim_runner` drives the engine twin's own scheduler token by token behind the
router's own policy objects: exact, and fast enough for 4-16 engines. A fleet of 250 replicas
serving ~10^6 requests an hour needs a coarser engine and routing decisions that do not look
at every replica. This module is that model; `tpuserve plan` and ``bench/fleet_tokens_per_day.py``
run it. What it models, and how it differs from the token-level twin:

**Engines** (one per replica slot). Continuous batching with chunked prefill, as SGLang runs
it: each step prefills up to ``chunked_prefill_size`` uncached prompt tokens (FIFO, several
requests packed into one step) and decodes one token for every running request; step times
come from the calibrated performance model (`sglang_tpu.perf_model.StepTimer`, the twin's).
Steps are not simulated one by one: between two events (an arrival, a prefill step, the
next request to finish) the batch is fixed and each step adds one token per running request,
so the time of ``k`` decode steps is a closed-form sum (step time is affine in the context
read) and the engine jumps straight to the next event. Admission reserves prompt + output
tokens of the KV pool (`perf_model.kv_pool_tokens`) and at most ``max_running_requests``;
the rest of the pool is the prefix cache: an LRU of Mooncake-style 512-token blocks (a block
id names its whole prefix), filled with a prompt's blocks when its prefill ends, children
evicted before parents. Running requests' own blocks count twice (reserved and cached): the
model under-uses memory slightly. With ``host_cache_tokens`` each engine also has a host-memory
tier (SGLang's HiCache, docs/host-kv-tier.md): a block evicted from HBM is demoted to it (an
LRU of ``host_cache_tokens`` tokens), a prompt's blocks found there after its HBM hit count as
cached and are loaded back before its prefill, at the catalog's host-to-device bandwidth
(`StepTimer.load_back_seconds`, added to the step that prefills it). The ``precise`` routers
route by tier as the router does (`tpuserve_router.policies.precise.decide_tiered`): each
candidate's prefix is its HBM blocks then the host blocks that continue them, a host block
weighs ``host_hit_weight`` (`StepTimer.host_hit_value` of the slice and model, what the
operator passes the router), and HBM room decides last (each router counts the prompt
tokens of the requests it and its peers have in flight on an engine against the KV pool).
With ``tier_blind_routing`` the routers see the HBM only, as routers before tiers did (a
demoted prefix is forgotten).

**Routers.** ``router_replicas`` routers; each request goes to one at random. A router knows
exactly what it sent (its own in-flight counts and booked prefill tokens) and what the other
routers put on each engine as of its last load poll (every ``load_poll_seconds``, phase
``r / N``), as ``tpuserve router`` does with ``/v1/loads``. With ``peer_delay_seconds`` (the
default, 1 ms) the ``precise`` routers also peer as ``tpuserve router --peer-port`` replicas
do (`tpuserve_router.peering.peer_view`, on by default from the operator): each decision,
first token and end reaches every other router ``peer_delay_seconds`` later, and it applies
it as if it had routed the request itself: +1 in flight on the engine (-1 at the end), the
booked prefill tokens (released at the first token) and the decision's predicted blocks (for
``PRECISE.predicted_ttl_seconds`` from then). The poll then adds only what the engine holds
beyond what the router knows of (`tpuserve_router.engines.load_view`'s rule). None: no
peering, the poll alone. The other policies do not peer (round-robin keeps its own cycle;
the llm-d and oracle anchors are not tpuserve's router). Prefix holders come from one index
of what the engines hold (their KV events, applied at once); the llm-d anchor keeps its own
per-router approximate index instead (filled at routing time, as llm-d's EPP does). A
decision never looks at every replica: its candidates are at most ``holder_candidates``
engines among those holding the prompt's longest cached prefix (found by binary search over
the prompt's blocks: a few dict lookups) plus ``random_candidates`` engines drawn at random
(power of d choices); only they are scored. A fleet of no more routable replicas than that
is scored whole, in order, as the router scores its workers. Policies (`FLEET_POLICIES`):

- ``round_robin``: each router cycles over the routable replicas on its own;
- ``precise``: tpuserve's default policy's own decision (`tpuserve_router.policies.precise`'s
  `decide`, with `PreciseParams`' defaults) over the candidates: imbalance -> least loaded;
  prefix match over ``cache_threshold`` -> least loaded holder; else least loaded (ties: the
  fewest cached blocks, then in turns); then leave a long prefill queue (`queue_move`);
  predicted blocks for `predicted_ttl_seconds` (2 s) after a decision;
- ``llmd``: llm-d's scorer configuration for SGLang, ``prefix-cache-scorer`` weight 2 and
  ``queue-scorer`` weight 1 with the max-score picker (reference pd-disaggregation.md §1.5,
  router.md §4.1): approximate prefix score (leading blocks the router sent to the pod / the
  prompt's blocks) + ``(maxQ - q) / (maxQ - minQ)`` over the pods' waiting queues as of the
  last scrape;
- ``oracle``: the true caches and queues, lowest predicted TTFT (`anchors.oracle`'s rule),
  over a candidate set twice as large.

**Traffic.** Sessions drawn from the Mooncake conversation and tool&agent shapes
(`tpuserve.bench.mooncake`: prompts 1-92k tokens, the published reuse) mixed by
``conversation_share``; they start as a Poisson process whose rate follows a daily shape
(`daily_multiplier`: a cosine from ``trough`` at 03:00 to 1 at 15:00) times bursts
(``bursts_per_hour`` windows of ``burst_seconds`` at ``burst_factor`` x). A session's next
turn arrives a think time after the previous one.

**Autoscaler, cold starts, Spot.** With ``autoscale`` the HorizontalPodAutoscaler's rule
runs every ``hpa_interval_seconds`` on the ``tokensInFlight`` metric (KV tokens reserved per
chip, `AutoscalingSpec.metric`): ``desired = ceil(replicas x metric / target)`` outside a
10 % tolerance, then the HorizontalPodAutoscaler's ``behavior`` (``behavior``: the operator's
`tpuserve_operator.scaling_behavior.Behavior`, the object it renders; default the CRD's
default): stabilization windows and rate policies, slices removed drained first. A new slice
serves after
a cold start drawn uniformly from ``cold_start_seconds`` (node, image, weights, compile).
Spot preemptions hit each live slice as a Poisson process of ``preemptions_per_replica_hour``;
after ``preemption_notice_seconds`` (GKE's 30 s) the slice dies, its unfinished requests fail
and it comes back after a cold start (the StatefulSet's pod on a new node).

`run_fleet` returns a `FleetResult`: tokens, goodput under the SLO (TTFT and mean ITL per
request), percentiles, cache hits, chip-seconds and the wall time.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import math
import random
import time
from array import array
from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sglang_tpu.perf_model import ENGINES, ModelProfile, StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.topology import CatalogError, SliceShape, lookup
from tpuserve.bench import mooncake
from tpuserve_operator import scaling_behavior
from tpuserve_operator.scaling_behavior import Behavior, Stepper
from tpuserve_router.policies.precise import PreciseParams, decide, decide_tiered

BLOCK_TOKENS = mooncake.MOONCAKE_BLOCK_TOKENS
FLEET_POLICIES = ("round_robin", "precise", "llmd", "oracle")
WORKLOADS = ("mooncake", "lengths")
"""The policies the fleet model routes with (module docstring)."""
LLMD_PREFIX_WEIGHT = 2.0
LLMD_QUEUE_WEIGHT = 1.0
"""llm-d's scorer weights for SGLang (prefix-cache-scorer 2 : queue-scorer 1)."""
PRECISE = PreciseParams()
"""The ``precise`` routers' parameters: the router's defaults."""
PREDICTED_BLOCKS = 4
"""The precise model predicts at most this many blocks past the index's match (the router
predicts the whole prompt; siblings of a burst share the first new block)."""
ORACLE_FULL_POOL = 0.9
ORACLE_MEMORY_PENALTY_STEPS = 16
"""`tpuserve.bench.anchors.oracle`'s constants."""
HPA_TOLERANCE = 0.1

# Engine states.
OFF, STARTING, READY, DRAINING, NOTICED = 0, 1, 2, 3, 4
# Event kinds (heap entries are (time, seq, kind, a, b)).
_STEP, _ARRIVAL, _SESSION, _POLL, _HPA, _UP, _NOTICE, _KILL, _SAMPLE = range(9)
Holders = dict[int, int | set[int]]
"""Block -> the engine that holds it, or the set of them once a second one did (most blocks
have one holder: a set each cost time and memory). A set stays a set."""
SAMPLE_SECONDS = 5.0
"""How often the KV tokens in flight are sampled (`FleetResult.tokens_in_flight_per_chip`)."""


_SINGLE = mooncake.TraceShape(
    mooncake.PublishedStats("lengths", 0, 0, None, 0, 0.0),
    continue_probability=0.0,
    max_input_tokens=10**9,
)
"""The ``lengths`` workload's requests: one turn each (outputs from the config)."""


def add_peering_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet benchmarks' ``--peer-delay`` / ``--no-peering`` (`peer_delay_from`)."""
    default = FleetConfig.peer_delay_seconds
    parser.add_argument(
        "--peer-delay", type=float, default=default,
        help=f"Seconds a router replica hears its peers' decisions after them ({default}).",
    )  # fmt: skip
    parser.add_argument("--no-peering", action="store_true",
                        help="Router replicas do not peer: the load poll alone.")  # fmt: skip


def peer_delay_from(args: argparse.Namespace) -> float | None:
    """``FleetConfig.peer_delay_seconds`` from `add_peering_arguments`' flags."""
    return None if args.no_peering else float(args.peer_delay)


def daily_multiplier(hour: float, trough: float) -> float:
    """Demand at ``hour`` (0-24) relative to the daily peak: a cosine from ``trough`` at 03:00
    to 1.0 at 15:00. Its mean over the day is ``(1 + trough) / 2``."""
    return trough + (1.0 - trough) * 0.5 * (1.0 - math.cos(2.0 * math.pi * (hour - 3.0) / 24.0))


@dataclass(frozen=True)
class FleetConfig:
    generation: str = "v6e"
    topology: str = "2x2"
    model: str = "llama-3.1-8b"
    quantization: str = "bf16"
    policy: str = "precise"
    replicas: int = 250
    """Replica slots: the fleet's size without autoscaling, its maximum with it."""
    min_replicas: int = 1
    initial_replicas: int | None = None
    """Replicas serving at the start (None: ``replicas``)."""
    router_replicas: int = 1
    peer_delay_seconds: float | None = 0.001
    """Router replicas peer (``precise``): each hears the others' decisions, first tokens and
    ends this many seconds later (`tpuserve_router.peering.peer_view`; the routing benchmark's
    ``--peer-delay``, ``bench/peer_latency.py`` measures ~0.2 ms median on loopback). None: no
    peering, each router sees the others only through its load poll."""
    peak_rate: float = 100.0
    """Requests per second at the daily peak, before bursts."""
    trough: float = 0.35
    start_hour: float = 14.0
    """Hour of the day the simulated window starts at."""
    duration_seconds: float = 3600.0
    warmup_seconds: float = 0.0
    """Requests arriving before this are served but not counted."""
    workload: str = "mooncake"
    """``mooncake``: sessions of the Mooncake shapes (``conversation_share``); ``lengths``:
    single requests whose prompt is one of ``prefix_groups`` shared prefixes (Zipf
    ``prefix_zipf``) of ``reuse_share`` x ``input_median`` tokens plus a private part
    (log-normal, median ``(1 - reuse_share) x input_median``, shape ``input_sigma``), output
    uniform over ``output_min``-``output_max``."""
    conversation_share: float = 0.5
    """Share of sessions drawn from the conversation shape; the rest are tool&agent."""
    input_median: float = 1000.0
    input_sigma: float = 0.5
    output_min: int = 100
    output_max: int = 500
    reuse_share: float = 0.0
    prefix_groups: int = 16
    prefix_zipf: float = 0.8
    block_tokens: int = BLOCK_TOKENS
    """Prefix-cache granularity (Mooncake's traces: 512-token blocks)."""
    profile: ModelProfile | None = None
    engine: str = "sglang"
    """Whose step times (`perf_model.ENGINES`): SGLang's (the twin's), or SGLang-JAX's
    (`sglang_tpu.sgl_jax_steps`: its host terms and padding)."""
    """A model profile not in the catalog (from a config.json); None: ``model``'s."""
    bursts_per_hour: float = 2.0
    burst_factor: float = 2.0
    burst_seconds: float = 60.0
    autoscale: bool = False
    target_tokens_per_chip: float = 60_000.0
    hpa_interval_seconds: float = 15.0
    behavior: Behavior = scaling_behavior.DEFAULT
    """How fast the autoscaler may change the replicas (the HPA's ``behavior``; the scale-down
    stabilization window is its ``scale_down.stabilization_seconds``)."""
    cold_start_seconds: tuple[float, float] = (240.0, 480.0)
    preemptions_per_replica_hour: float = 0.0
    preemption_notice_seconds: float = 30.0
    load_poll_seconds: float = 0.1
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    slo_ttft_seconds: float = 2.0
    slo_itl_seconds: float = 0.1
    holder_candidates: int = 8
    random_candidates: int = 8
    drain_seconds: float = 600.0
    """After the window, in-flight requests get this long to finish."""
    host_cache_tokens: int = 0
    """Each replica's host-memory KV tier in tokens (SGLang's HiCache; 0: HBM only)."""
    tier_blind_routing: bool = False
    """``precise`` ignores the host tier (routes on what the engines hold in HBM only)."""
    max_requests: int = 50_000_000
    seed: int = 0

    def validate(self) -> None:
        def bad(name: str, value: Any, allowed: str) -> ValueError:
            return ValueError(f"{name}: {value!r} is not allowed; allowed: {allowed}")

        if self.engine not in ENGINES:
            raise bad("engine", self.engine, ", ".join(ENGINES))
        try:
            lookup(self.generation, self.topology)
        except CatalogError as err:
            raise ValueError(str(err)) from None
        if self.profile is None:
            get_profile(self.model, "model")
        if self.workload not in WORKLOADS:
            raise bad("workload", self.workload, ", ".join(WORKLOADS))
        if not 1 <= self.output_min <= self.output_max:
            raise bad("output_min", self.output_min, f"1..output_max ({self.output_max})")
        if not 0 <= self.reuse_share < 1:
            raise bad("reuse_share", self.reuse_share, "0 <= share < 1")
        if not 16 <= self.block_tokens <= 4096:
            raise bad("block_tokens", self.block_tokens, "16..4096")
        if self.prefix_groups < 1:
            raise bad("prefix_groups", self.prefix_groups, ">= 1")
        if not 1 <= self.input_median < math.inf:
            raise bad("input_median", self.input_median, ">= 1 token")
        if not 0 <= self.input_sigma <= 3:
            raise bad("input_sigma", self.input_sigma, "0..3")
        if self.policy not in FLEET_POLICIES:
            raise bad("policy", self.policy, ", ".join(FLEET_POLICIES))
        for name in ("replicas", "router_replicas", "max_running_requests",
                     "chunked_prefill_size", "holder_candidates", "random_candidates",
                     "max_requests"):  # fmt: skip
            if getattr(self, name) < 1:
                raise bad(name, getattr(self, name), ">= 1")
        if not 0 <= self.min_replicas <= self.replicas:
            raise bad("min_replicas", self.min_replicas, f"0..{self.replicas}")
        initial = self.initial_replicas
        if initial is not None and not 1 <= initial <= self.replicas:
            raise bad("initial_replicas", initial, f"1..{self.replicas}")
        for name in ("peak_rate", "duration_seconds", "burst_factor", "target_tokens_per_chip",
                     "hpa_interval_seconds", "slo_ttft_seconds", "slo_itl_seconds"):  # fmt: skip
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise bad(name, value, "> 0 and finite")
        for name in ("warmup_seconds", "bursts_per_hour", "burst_seconds", "load_poll_seconds",
                     "preemptions_per_replica_hour",
                     "preemption_notice_seconds", "drain_seconds"):  # fmt: skip
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise bad(name, value, ">= 0 and finite")
        peer_delay = self.peer_delay_seconds
        if peer_delay is not None and not 0 <= peer_delay < math.inf:
            raise bad("peer_delay_seconds", peer_delay, ">= 0 and finite, or None (no peering)")
        if not 0 <= self.trough <= 1:
            raise bad("trough", self.trough, "0..1")
        if not 0 <= self.conversation_share <= 1:
            raise bad("conversation_share", self.conversation_share, "0..1")
        if not 0 <= self.start_hour < 24:
            raise bad("start_hour", self.start_hour, "0 <= hour < 24")
        lo, hi = self.cold_start_seconds
        if not 0 <= lo <= hi < math.inf:
            raise bad("cold_start_seconds", self.cold_start_seconds, "0 <= min <= max")
        if self.host_cache_tokens < 0:
            raise bad("host_cache_tokens", self.host_cache_tokens, ">= 0 tokens (0: no tier)")
        if self.warmup_seconds >= self.duration_seconds:
            raise bad("warmup_seconds", self.warmup_seconds, "< duration_seconds")

    @property
    def shape(self) -> SliceShape:
        return lookup(self.generation, self.topology)

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["behavior"] = self.behavior.manifest()
        return out


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of the workload, as drawn: arrival (s), its prompt's block ids (a block id
    names its whole prefix), prompt and output tokens."""

    arrival: float
    blocks: tuple[int, ...]
    prompt: int
    output: int


class _Request:
    __slots__ = ("arrival", "blocks", "booked", "cached", "depth", "engine", "first",
                 "host_cached", "output", "prompt", "router", "session", "uncached")  # fmt: skip

    def __init__(
        self, arrival: float, blocks: tuple[int, ...], prompt: int, output: int, session: int
    ) -> None:
        self.arrival = arrival
        self.blocks = blocks
        self.prompt = prompt
        self.output = output
        self.session = session
        self.router = 0
        self.engine = -1
        self.booked = 0
        self.cached = 0
        self.host_cached = 0  # of them, loaded back from the host tier
        self.depth = 0  # leading blocks the engine held at admission
        self.uncached = 0
        self.first = -1.0


class _Session:
    __slots__ = ("blocks", "length", "shape", "turn")

    def __init__(self, shape: mooncake.TraceShape, blocks: tuple[int, ...], length: int) -> None:
        self.shape = shape
        self.blocks = blocks
        self.length = length
        self.turn = 0


class _Engine:
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
        self.run: list[tuple[int, int, _Request]] = []  # (finish step, seq, request)
        self.seq = 0
        self.ctx_p = 0
        self.ctx_s = 0
        self.waiting: deque[_Request] = deque()
        self.prefill: list[list[Any]] = []  # [request, tokens left]
        self.prefill_step: list[tuple[_Request, int]] | None = None  # the step in progress
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


class _Router:
    __slots__ = ("booked", "cursor", "llmd_index", "llmd_lru", "own", "pred", "pred_queue",
                 "room", "rr", "snap_booked", "snap_load", "snap_own", "snap_wait",
                 "snap_wtok")  # fmt: skip

    def __init__(self, slots: int) -> None:
        self.own = [0] * slots
        self.room = [0] * slots  # prompt tokens in flight per engine (`precise.HbmRoom`)
        self.booked = [0] * slots
        self.snap_load = [0] * slots
        self.snap_own = [0] * slots
        self.snap_wait = [0] * slots
        self.snap_wtok = [0] * slots
        self.snap_booked = [0] * slots
        self.rr = 0
        self.cursor = 0  # `decide`'s, among equally loaded, equally full candidates
        self.pred: dict[int, tuple[int, float]] = {}
        self.pred_queue: deque[tuple[float, tuple[int, ...], int]] = deque()
        self.llmd_index: dict[int, set[int]] = {}
        self.llmd_lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(slots)]


@dataclass
class FleetResult:
    config: FleetConfig
    wall_seconds: float
    virtual_seconds: float
    requests: int = 0
    """Requests arriving in the measured window."""
    completed: int = 0
    failed: int = 0
    unfinished: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0
    """Of ``cached_tokens``, those loaded back from the engines' host tier."""
    good_requests: int = 0
    good_input_tokens: int = 0
    good_output_tokens: int = 0
    chip_seconds: float = 0.0
    """Chips held (starting, serving, draining) integrated over the measured window."""
    ttft: array[float] = field(default_factory=lambda: array("d"))
    itl: array[float] = field(default_factory=lambda: array("d"))
    replicas_min: int = 0
    replicas_max: int = 0
    preemptions: int = 0
    scale_ups: int = 0
    scale_downs: int = 0
    events: int = 0
    tokens_in_flight_samples: list[float] = field(default_factory=list)
    """KV tokens reserved per serving chip, every `SAMPLE_SECONDS` of the window (the
    autoscaler's ``tokensInFlight`` metric)."""

    @property
    def window_seconds(self) -> float:
        return self.config.duration_seconds - self.config.warmup_seconds

    def percentile(self, values: array[float], q: float) -> float | None:
        return _percentile(sorted(values), q)

    def summary(self) -> dict[str, Any]:
        window = self.window_seconds
        day = 86_400.0 / window
        chips = self.config.shape.chips
        ttft, itl = sorted(self.ttft), sorted(self.itl)
        tokens = self.input_tokens + self.output_tokens
        good = self.good_input_tokens + self.good_output_tokens
        return {
            "policy": self.config.policy,
            "router_replicas": self.config.router_replicas,
            "peer_delay_seconds": self.config.peer_delay_seconds,
            "replica_slots": self.config.replicas,
            "chips_max": self.config.replicas * chips,
            "window_seconds": window,
            "wall_seconds": round(self.wall_seconds, 1),
            "events": self.events,
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "unfinished": self.unfinished,
            "tokens_per_second": tokens / window,
            "output_tokens_per_second": self.output_tokens / window,
            "goodput_tokens_per_second": good / window,
            "goodput_output_tokens_per_second": self.good_output_tokens / window,
            "tokens_per_day": tokens * day,
            "goodput_tokens_per_day": good * day,
            "goodput_share": self.good_requests / self.requests if self.requests else 0.0,
            "cache_hit_rate": self.cached_tokens / self.input_tokens if self.input_tokens else 0.0,
            "host_cache_hit_rate": (
                self.host_cached_tokens / self.input_tokens if self.input_tokens else 0.0
            ),
            "host_cache_tokens": self.config.host_cache_tokens,
            "ttft_p50": _percentile(ttft, 0.5),
            "ttft_p99": _percentile(ttft, 0.99),
            "itl_p50": _percentile(itl, 0.5),
            "itl_p99": _percentile(itl, 0.99),
            "mean_chips": self.chip_seconds / window,
            "replicas_min": self.replicas_min,
            "replicas_max": self.replicas_max,
            "preemptions": self.preemptions,
            "scale_ups": self.scale_ups,
            "scale_downs": self.scale_downs,
            "tokens_in_flight_per_chip": (
                sum(self.tokens_in_flight_samples) / len(self.tokens_in_flight_samples)
                if self.tokens_in_flight_samples
                else 0.0
            ),
        }


class FleetSim:
    def __init__(self, config: FleetConfig) -> None:
        config.validate()
        self.config = config
        self.block = config.block_tokens
        c = config
        shape = c.shape
        profile = c.profile or get_profile(c.model, "model")
        self.chips = shape.chips
        self.timer = StepTimer(shape, profile, c.quantization, engine=c.engine)
        self.pool = kv_pool_tokens(shape, profile, c.quantization, engine=c.engine)
        self.host_blocks = c.host_cache_tokens // self.block
        self.tiered = self.host_blocks > 0 and not c.tier_blind_routing and c.policy == "precise"
        """``precise`` routes by tier (`decide_tiered`) once some engine holds host blocks."""
        self.tier_params = replace(PRECISE, host_hit_weight=round(self.timer.host_hit_value(), 3))
        if self.pool < self.block:
            raise ValueError(
                f"model: {c.model} leaves no KV pool on {c.generation} {c.topology}; allowed: "
                "a model and topology that fit (see `tpuserve plan`)"
            )
        self.context_length = min(profile.context_length, self.pool)
        self.rng = random.Random(f"fleet:{c.seed}")
        self.route_rng = random.Random(f"fleet-route:{c.seed}")
        # Decode steps are affine in the context read: step(b, C) = a[b] + s x C.
        t = self.timer
        self.decode_a = [t.step_seconds(decode_batch=b) for b in range(c.max_running_requests + 1)]
        probe = 1_000_000
        one = t.step_seconds(decode_batch=1, decode_context=probe)
        self.decode_s = (one - self.decode_a[1]) / probe
        # Linear prefill cost for the oracle's estimate: tokens and attention context.
        self.prefill_per_token = t._body_flops_per_token / t.flops_per_second
        self.prefill_per_attention = t._attn_flops_per_ctx / t.attention_flops_per_second
        self.prefill_budget = c.chunked_prefill_size
        self.max_running = c.max_running_requests
        self.k_held = c.holder_candidates
        self.k_random = c.random_candidates * (2 if c.policy == "oracle" else 1)
        n = c.replicas
        self.engines = [_Engine(i) for i in range(n)]
        self.routers = [_Router(n) for _ in range(c.router_replicas)]
        self.peering = (
            c.peer_delay_seconds is not None and c.router_replicas > 1 and c.policy == "precise"
        )
        self.peer_delay = c.peer_delay_seconds or 0.0
        self.peers_of = [[p for p in self.routers if p is not r] for r in self.routers]
        self.peer_messages: deque[tuple[float, int, int, int, int, int, tuple[int, ...]]] = deque()
        """(delivery time, sending router, engine, in flight +-1, booked tokens +-, prompt tokens
        in flight +- (HBM room), predicted blocks): the peering messages on their way, in the
        order sent (one delay: in time)."""
        self.predicted: tuple[int, ...] = ()  # the decision's predicted blocks (`_predict`)
        self.holders: Holders = {}
        self.host_holders: Holders = {}  # the engines' host-tier blocks (tiered routing only)
        self.ready: list[int] = []
        self.ready_pos: dict[int, int] = {}
        # What the engines report to a load poll, kept current as they change.
        self.load = [0] * n  # running + waiting
        self.wait = [0] * n  # waiting (not yet running)
        self.wtok = [0] * n  # uncached prompt tokens waiting
        self.events: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.now = 0.0
        self.next_block = 1 + max(1, mooncake.CONVERSATION.shared_blocks)
        self.templates = self._templates()
        self.shapes = (mooncake.CONVERSATION, mooncake.TOOL_AGENT)
        self.groups = self._groups()
        mean_turns = c.conversation_share / (1 - mooncake.CONVERSATION.continue_probability) + (
            1 - c.conversation_share
        ) / (1 - mooncake.TOOL_AGENT.continue_probability)
        if c.workload == "lengths":
            mean_turns = 1.0
        self.session_peak = c.peak_rate / mean_turns
        self.bursts = self._bursts()
        self.session_count = 0
        self.spec_replicas = 0
        self.stepper = Stepper(c.behavior)
        self.chips_held = 0
        self.chips_since = 0.0
        self.result = FleetResult(c, 0.0, 0.0)
        self.arrived = 0
        self.opened = False
        self.drawn: list[WorkloadRequest] | None = None
        """Where `requests` and `session_requests` collect the workload's requests, which are
        then drawn and not served."""

    # --- traffic --------------------------------------------------------------------------

    def _templates(self) -> list[tuple[list[int], int]]:
        """The tool&agent shape's shared templates (block ids, tokens)."""
        shape = mooncake.TOOL_AGENT
        rng = random.Random(f"fleet-templates:{self.config.seed}")
        out = []
        for _ in range(shape.templates):
            tokens = rng.randint(shape.template_min, shape.template_max) // self.block
            ids = list(range(self.next_block, self.next_block + tokens))
            self.next_block += tokens
            out.append((ids, tokens * self.block))
        return out

    def _groups(self) -> list[list[int]]:
        """The ``lengths`` workload's shared prefixes (block ids)."""
        c = self.config
        if c.workload != "lengths" or c.reuse_share <= 0:
            return []
        blocks = int(c.reuse_share * c.input_median) // self.block
        out = []
        for _ in range(c.prefix_groups):
            out.append(list(range(self.next_block, self.next_block + blocks)))
            self.next_block += blocks
        return out

    def _bursts(self) -> list[float]:
        c = self.config
        rng = random.Random(f"fleet-bursts:{c.seed}")
        out: list[float] = []
        t = 0.0
        if c.bursts_per_hour > 0 and c.burst_seconds > 0:
            while True:
                t += rng.expovariate(c.bursts_per_hour / 3600.0)
                if t >= c.duration_seconds:
                    break
                out.append(t)
        return out

    def rate_multiplier(self, t: float) -> float:
        """The arrival rate at ``t`` relative to ``peak_rate``: daily shape x bursts."""
        c = self.config
        m = daily_multiplier((c.start_hour + t / 3600.0) % 24.0, c.trough)
        i = bisect_right(self.bursts, t) - 1
        if i >= 0 and t < self.bursts[i] + c.burst_seconds:
            m *= c.burst_factor
        return m

    def _next_session(self, t: float) -> None:
        """Schedule the next session start after ``t`` (thinning of the daily rate)."""
        c = self.config
        top = self.session_peak * max(1.0, c.burst_factor)
        rng = self.rng
        while True:
            t += rng.expovariate(top)
            if t >= c.duration_seconds:
                return
            if rng.random() * top <= self.session_peak * self.rate_multiplier(t):
                self._push(t, _SESSION, None, 0)
                return

    def _start_session(self) -> None:
        rng = self.rng
        c = self.config
        if c.workload == "lengths":
            blocks: list[int] = []
            if self.groups:
                blocks = self.groups[mooncake._zipf(rng, len(self.groups), c.prefix_zipf)]
            private_median = max(1.0, (1.0 - c.reuse_share) * c.input_median)
            room = self.context_length - 1 - c.output_max - len(blocks) * self.block
            add = min(mooncake._lognormal(rng, private_median, c.input_sigma), max(1, room))
            one = _Session(_SINGLE, tuple(blocks), len(blocks) * self.block)
            self.session_count += 1
            self._turn(one, add)
            return
        conversation = rng.random() < self.config.conversation_share
        shape = self.shapes[0 if conversation else 1]
        blocks = list(range(shape.shared_blocks))
        length = len(blocks) * self.block
        if not conversation and self.templates:
            ids, tokens = self.templates[mooncake._zipf(rng, len(self.templates),
                                                        shape.template_zipf)]  # fmt: skip
            blocks = blocks + ids
            length += tokens
        session = _Session(shape, tuple(blocks), length)
        self.session_count += 1
        self._turn(session, mooncake._lognormal(rng, shape.first_median, shape.first_sigma))

    def _turn(self, session: _Session, add: int) -> None:
        shape = session.shape
        if session.length + add > min(shape.max_input_tokens, self.context_length - 1):
            return
        kept = session.length // self.block
        session.length += add
        fresh = math.ceil(session.length / self.block) - kept
        nb = self.next_block
        session.blocks = session.blocks[:kept] + tuple(range(nb, nb + fresh))
        self.next_block = nb + fresh
        rng = self.rng
        lo, hi = shape.output_min, shape.output_max
        if shape is _SINGLE:
            lo, hi = self.config.output_min, self.config.output_max
        output = min(rng.randint(lo, hi),
                     self.context_length - session.length)  # fmt: skip
        req = _Request(self.now, session.blocks, session.length, output, 0)
        if self.drawn is None:
            self._arrive(req)
        else:
            self.drawn.append(WorkloadRequest(req.arrival, req.blocks, req.prompt, req.output))
        if rng.random() < shape.continue_probability:
            t = self.now + rng.expovariate(1.0 / shape.think_seconds)
            if t < self.config.duration_seconds:
                nxt = output + mooncake._lognormal(rng, shape.turn_median, shape.turn_sigma)
                self._push(t, _ARRIVAL, session, nxt)

    # --- events ---------------------------------------------------------------------------

    def _push(self, t: float, kind: int, a: Any, b: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def run(self) -> FleetResult:
        """Run the window and the drain. The cyclic garbage collector is paused meanwhile:
        the model makes no reference cycles (reference counting frees everything; a unit test
        checks it), and with ~10^6 live objects its collections took ~12 % of the time."""
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
        drawn = self.drawn = []
        try:
            self._next_session(0.0)
            events = self.events
            while events and len(drawn) < limit:
                t, _, kind, a, b = heapq.heappop(events)
                self.now = t
                if kind == _SESSION:
                    self._start_session()
                    self._next_session(t)
                elif kind == _ARRIVAL:
                    self._turn(a, b)
        finally:
            self.drawn = None
        return drawn

    def session_requests(self, limit: int) -> list[WorkloadRequest]:
        """Whole sessions' requests, the sessions drawn one after the other (not on the
        arrival process), until at least ``limit`` requests: the workload's mix of prompts and
        outputs. Call it on a fresh model, instead of `run`."""
        drawn = self.drawn = []
        try:
            while len(drawn) < limit:
                self._start_session()
                while self.events:  # the session's later turns
                    t, _, kind, a, b = heapq.heappop(self.events)
                    if kind == _ARRIVAL:
                        self.now = t
                        self._turn(a, b)
        finally:
            self.drawn = None
        return drawn

    def choose(self, blocks: tuple[int, ...], prompt_tokens: int, router: int = 0) -> int:
        """The engine router ``router`` would send a request for ``blocks`` arriving now to,
        by the configured policy, as `run` decides (what it books and predicts included); the
        request is not served. Brings the initial replicas up first."""
        self._open()
        req = _Request(self.now, blocks, prompt_tokens, 1, 0)
        return self._route(self.routers[router], req)[0]

    def cache(self, engine: int, blocks: tuple[int, ...]) -> None:
        """Engine ``engine`` caches ``blocks`` now, as when a prefill of them ends there."""
        self._insert(self.engines[engine], blocks, 0)

    def _open(self) -> None:
        """Bring the initial replicas up (once)."""
        if self.opened:
            return
        self.opened = True
        c = self.config
        initial = c.initial_replicas if c.initial_replicas is not None else c.replicas
        for i in range(initial):
            self._set_state(self.engines[i], READY)
            self._schedule_preemption(self.engines[i])
        self.spec_replicas = initial
        self.result.replicas_min = self.result.replicas_max = initial

    def _run(self) -> FleetResult:
        c = self.config
        start = time.perf_counter()
        self._open()
        self._next_session(0.0)
        if c.router_replicas and c.load_poll_seconds > 0 and c.policy != "round_robin":
            for r in range(c.router_replicas):
                self._push(r * c.load_poll_seconds / c.router_replicas, _POLL, r, 0)
        if c.autoscale:
            self._push(c.hpa_interval_seconds, _HPA, None, 0)
        self._push(c.warmup_seconds + SAMPLE_SECONDS, _SAMPLE, None, 0)
        duration = c.duration_seconds
        end = duration + c.drain_seconds
        events = self.events
        engines = self.engines
        pop = heapq.heappop
        step = self._engine_event
        count = 0
        while events:
            t, _, kind, a, b = pop(events)
            if t > end:
                break
            if t > duration and kind in (_POLL, _HPA) and not self._busy():
                break
            count += 1
            self.now = t
            if kind == _STEP:
                e = engines[a]
                if b == e.version:
                    step(e)
            elif kind == _SESSION:
                if self.arrived < c.max_requests:
                    self._start_session()
                    self._next_session(t)
            elif kind == _ARRIVAL:
                self._turn(a, b)
            elif kind == _POLL:
                self._poll(self.routers[a])
                if t <= c.duration_seconds or self._busy():
                    self._push(t + c.load_poll_seconds, _POLL, a, 0)
            elif kind == _HPA:
                self._autoscale()
                if t <= c.duration_seconds:
                    self._push(t + c.hpa_interval_seconds, _HPA, None, 0)
            elif kind == _SAMPLE:
                serving = [e for e in self.engines if e.state == READY]
                if serving:
                    reserved = sum(e.reserved for e in serving)
                    self.result.tokens_in_flight_samples.append(
                        reserved / (len(serving) * self.chips)
                    )
                if t + SAMPLE_SECONDS <= c.duration_seconds:
                    self._push(t + SAMPLE_SECONDS, _SAMPLE, None, 0)
            elif kind == _UP:
                e = self.engines[a]
                if e.incarnation == b and e.state == STARTING:
                    self._set_state(e, READY)
                    self._schedule_preemption(e)
            elif kind == _NOTICE:
                e = self.engines[a]
                if e.incarnation == b and e.state in (READY, DRAINING):
                    self._set_state(e, NOTICED)
                    self._push(t + c.preemption_notice_seconds, _KILL, a, b)
            elif kind == _KILL:
                e = self.engines[a]
                if e.incarnation == b and e.state == NOTICED:
                    self.result.preemptions += 1
                    self._kill(e)
                    self._start(e)  # the pod comes back on a new node
        self._account_chips(min(self.now, c.duration_seconds))
        res = self.result
        res.unfinished = sum(
            1 for e in self.engines for r in self._requests_of(e) if r.arrival >= c.warmup_seconds
        )
        res.wall_seconds = time.perf_counter() - start
        res.virtual_seconds = self.now
        res.events = count
        return res

    def _requests_of(self, e: _Engine) -> list[_Request]:
        return list(e.waiting) + [p[0] for p in e.prefill] + [r for _, _, r in e.run]

    def _busy(self) -> bool:
        return any(e.run or e.waiting or e.prefill for e in self.engines)

    # --- engine lifecycle -----------------------------------------------------------------

    def _account_chips(self, t: float) -> None:
        c = self.config
        lo = max(self.chips_since, c.warmup_seconds)
        hi = min(t, c.duration_seconds)
        if hi > lo:
            self.result.chip_seconds += self.chips_held * (hi - lo)
        self.chips_since = max(self.chips_since, t)

    def _set_state(self, e: _Engine, state: int) -> None:
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
            self._account_chips(self.now)
            self.chips_held += self.chips if held else -self.chips
        n = sum(1 for x in self.engines if x.state in (STARTING, READY, NOTICED))
        res = self.result
        res.replicas_min = min(res.replicas_min, n)
        res.replicas_max = max(res.replicas_max, n)

    def _start(self, e: _Engine) -> None:
        lo, hi = self.config.cold_start_seconds
        e.incarnation += 1
        e.reset()
        self._set_state(e, STARTING)
        self._push(self.now + self.rng.uniform(lo, hi), _UP, e.i, e.incarnation)

    def _schedule_preemption(self, e: _Engine) -> None:
        rate = self.config.preemptions_per_replica_hour
        if rate > 0:
            at = self.now + self.rng.expovariate(rate / 3600.0)
            self._push(at, _NOTICE, e.i, e.incarnation)

    def _kill(self, e: _Engine) -> None:
        """The slice is gone: fail what it held, forget its cache."""
        for r in self._requests_of(e):
            self._release_router(r, first=False)
            self._record_failure(r)
        for block in e.cache:
            _unhold(self.holders, block, e.i)
        if self.tiered:
            for block in e.host:
                _unhold(self.host_holders, block, e.i)
        for router in self.routers:
            lru = router.llmd_lru[e.i]
            for block in lru:
                h = router.llmd_index.get(block)
                if h is not None:
                    h.discard(e.i)
            lru.clear()
        e.version += 1
        e.reset()
        self.load[e.i] = self.wait[e.i] = self.wtok[e.i] = 0
        self._set_state(e, OFF)

    def desired_replicas(self, current: int) -> int:
        """The autoscaler's desired replica count before the min/max bounds: the HPA's rule on
        ``tokensInFlight``. `tpuserve.bench.autoscaling` overrides it with other rules."""
        serving = [e for e in self.engines if e.state == READY]
        if not serving:
            return current
        metric = sum(e.reserved for e in serving) / (len(serving) * self.chips)
        ratio = metric / self.config.target_tokens_per_chip
        return current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(current * ratio)

    def record_outcome(self, arrival: float, good: bool) -> None:
        """Called once per counted request as it ends (``good``: within the SLO; a failed
        request is not good). A hook for `tpuserve.bench.autoscaling`; nothing here."""

    def _autoscale(self) -> None:
        """One HPA decision: the rule's desire within the bounds, then the behaviour's
        stabilization and rate (`Stepper`); new slices start cold, removed ones drain (a
        starting one first, else the least loaded)."""
        c = self.config
        live = [e for e in self.engines if e.state in (STARTING, READY, NOTICED)]
        current = len(live)
        lo, hi = max(1, c.min_replicas), c.replicas
        desired = max(lo, min(hi, self.desired_replicas(current)))
        target = self.stepper.step(self.now, current, desired, lo, hi)
        if target > current:
            for e in self.engines:
                if current >= target:
                    break
                if e.state == OFF:
                    self._start(e)
                    self.result.scale_ups += 1
                    current += 1
            return
        while current > target:
            victims = [e for e in live if e.state == STARTING] or [
                e for e in live if e.state == READY
            ]
            if not victims:
                return
            e = min(victims, key=lambda x: self.load[x.i])
            live.remove(e)
            current -= 1
            self.result.scale_downs += 1
            if e.state == STARTING:
                e.incarnation += 1
                self._set_state(e, OFF)
            else:
                self._set_state(e, DRAINING)
                self._maybe_off(e)

    def _maybe_off(self, e: _Engine) -> None:
        if e.state == DRAINING and not (e.run or e.waiting or e.prefill):
            self._kill(e)

    # --- routing --------------------------------------------------------------------------

    def _poll(self, router: _Router) -> None:
        if self.peering:
            self._deliver_peer_messages()
        router.snap_load = self.load[:]
        router.snap_wait = self.wait[:]
        router.snap_wtok = self.wtok[:]
        router.snap_own = router.own[:]
        router.snap_booked = router.booked[:]

    def _send_peers(
        self, r: int, e: int, in_flight: int, booked: int, predicted: tuple[int, ...], room: int
    ) -> None:
        """Router ``r`` publishes a decision (``in_flight`` +1, its booked tokens, predicted
        blocks and prompt tokens), a first token (the booking released) or an end (-1)."""
        self.peer_messages.append(
            (self.now + self.peer_delay, r, e, in_flight, booked, room, predicted)
        )

    def _deliver_peer_messages(self) -> None:
        """Every router applies its peers' messages due by now (`peer_view.PeerView.apply`)."""
        queue = self.peer_messages
        now = self.now
        peers_of = self.peers_of
        while queue and queue[0][0] <= now:
            at, r, e, in_flight, booked, room, predicted = queue.popleft()
            if predicted:
                expiry = at + PRECISE.predicted_ttl_seconds
                entry = (e, expiry)
                for router in peers_of[r]:
                    router.own[e] += in_flight
                    router.booked[e] += booked
                    router.room[e] += room
                    pred = router.pred
                    for b in predicted:
                        pred[b] = entry
                    router.pred_queue.append((expiry, predicted, e))
            else:
                for router in peers_of[r]:
                    router.own[e] += in_flight
                    router.booked[e] += booked
                    router.room[e] += room

    def _depth(self, blocks: tuple[int, ...], has: Callable[[int], bool]) -> int:
        """Leading blocks for which ``has`` holds (binary search: a holder of a block holds
        its parents, since children are evicted first)."""
        lo, hi = 0, len(blocks)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if has(blocks[mid - 1]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _candidates(self, holders: int | set[int] | None) -> tuple[list[int], list[int]]:
        """(holder candidates, all candidates) among the routable replicas. When there are
        no more of them than candidates, all, in order (the holders among them too)."""
        ready = self.ready
        rand = self.route_rng.random
        held: list[int] = []
        k_held = self.k_held
        n = len(ready)
        if n <= k_held + self.k_random:
            if isinstance(holders, int):
                held = [holders] if holders in self.ready_pos else []
            elif holders:
                held = [e for e in ready if e in holders]
            return held, ready[:]
        if isinstance(holders, int):
            if holders in self.ready_pos:
                held = [holders]
        elif holders:
            if len(holders) <= 2 * k_held:
                pos = self.ready_pos
                held = [h for h in holders if h in pos]
                if len(held) > k_held:
                    held = self.route_rng.sample(held, k_held)
            else:  # many holders: draw replicas at random until k of them hold it
                for _ in range(4 * k_held):
                    x = ready[int(rand() * n)]
                    if x in holders and x not in held:
                        held.append(x)
                        if len(held) == k_held:
                            break
        cands = held[:]
        seen = set(held)
        for _ in range(min(self.k_random, n)):
            x = ready[int(rand() * n)]
            if x not in seen:
                seen.add(x)
                cands.append(x)
        return held, cands

    def _arrive(self, req: _Request) -> None:
        c = self.config
        self.arrived += 1
        counted = req.arrival >= c.warmup_seconds
        if counted:
            self.result.requests += 1
        if not self.ready:
            self._record_failure(req)
            return
        r = int(self.route_rng.random() * len(self.routers)) if len(self.routers) > 1 else 0
        router = self.routers[r]
        req.router = r
        peering = self.peering
        if peering:
            self._deliver_peer_messages()
            self.predicted = ()
        target, hit = self._route(router, req)
        req.engine = target
        req.booked = max(0, req.prompt - hit)
        router.own[target] += 1
        router.booked[target] += req.booked
        router.room[target] += req.prompt
        if peering:
            self._send_peers(r, target, 1, req.booked, self.predicted, req.prompt)
        self._submit(self.engines[target], req)

    def _route(self, router: _Router, req: _Request) -> tuple[int, int]:
        """The engine ``router`` sends ``req`` to by the configured policy, and the prompt
        tokens it expects cached there."""
        policy = self.config.policy
        if policy == "round_robin":
            router.rr += 1
            return self.ready[router.rr % len(self.ready)], 0
        if policy == "precise":
            return self._precise(router, req)
        if policy == "llmd":
            return self._llmd(router, req)
        return self._oracle(req)

    def _view_load(self, router: _Router, e: int) -> int:
        return router.own[e] + max(0, router.snap_load[e] - router.snap_own[e])

    def _view_queue(self, router: _Router, e: int) -> int:
        return router.booked[e] + max(0, router.snap_wtok[e] - router.snap_booked[e])

    def _precise(self, router: _Router, req: _Request) -> tuple[int, int]:
        blocks = req.blocks
        holders = self.holders
        now = self.now
        pred = router.pred
        queue = router.pred_queue
        while queue and queue[0][0] <= now:
            expiry, old, e = queue.popleft()
            for b in old:
                if pred.get(b) == (e, expiry):
                    del pred[b]
        lo, hi = 0, len(blocks)  # `_depth` over the index, inline (once per request)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid - 1] in holders:
                lo = mid
            else:
                hi = mid - 1
        depth = pdepth = lo
        if self.tiered and self.host_holders:
            return self._precise_tiered(router, req, depth)
        while pdepth < len(blocks) and pdepth - depth < PREDICTED_BLOCKS and blocks[pdepth] in pred:
            pdepth += 1
        if pdepth > depth:
            e = pred[blocks[pdepth - 1]][0]
            if e in self.ready_pos:
                hit = pdepth * self.block
                self._predict(router, blocks, depth, e)
                return e, min(hit, req.prompt)
        held, cands = self._candidates(holders.get(blocks[depth - 1]) if depth else None)
        own, snap_load, snap_own = router.own, router.snap_load, router.snap_own
        # `_view_load` and `_view_queue` of each candidate
        loads = [own[e] + (x if (x := snap_load[e] - snap_own[e]) > 0 else 0) for e in cands]
        booked, snap_wtok, snap_booked = router.booked, router.snap_wtok, router.snap_booked
        queued = [booked[e] + (x if (x := snap_wtok[e] - snap_booked[e]) > 0 else 0) for e in cands]
        engines = self.engines
        cached = [len(engines[e].cache) for e in cands]  # what their KV events reported
        heldset = set(held)
        depths = [depth if e in heldset else 0 for e in cands]
        i, _, router.cursor = decide(
            depths, self.block, req.prompt, loads, cached, queued, router.cursor, PRECISE
        )
        chosen = cands[i]
        self._predict(router, blocks, depth, chosen)
        return chosen, min(depths[i] * self.block, req.prompt)

    def _precise_tiered(self, router: _Router, req: _Request, depth: int) -> tuple[int, int]:
        """`_precise` once some engine holds host-tier blocks: `decide_tiered` over each
        candidate's prefix as the router's index holds it (`BlockIndex.route`): its HBM blocks
        and the blocks predicted on it (``device``), then also its host blocks (``depths``),
        with ``depth`` the longest HBM prefix any engine holds. Predictions count as the
        router counts them (in the depths, not as a shortcut), so HBM room decides a predicted
        holder too."""
        blocks = req.blocks
        n = len(blocks)
        host_holders = self.host_holders
        pred = router.pred
        reach = depth  # the longest prefix any tier holds, for the holder candidates
        while reach < n and blocks[reach] in host_holders:
            reach += 1
        if reach > depth:
            source = host_holders.get(blocks[reach - 1])
        else:
            source = self.holders.get(blocks[depth - 1]) if depth else None
        _, cands = self._candidates(source)
        p = pred.get(blocks[depth]) if depth < n else None
        if p is not None and p[0] not in cands and p[0] in self.ready_pos:
            cands[-1] = p[0]  # the engine a burst's sibling went to
        engines = self.engines
        device: list[int] = []
        depths: list[int] = []
        for e in cands:
            eng = engines[e]
            cache = eng.cache
            lo, hi = 0, n if cache else 0  # HBM is prefix-closed: a binary search
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if blocks[mid - 1] in cache:
                    lo = mid
                else:
                    hi = mid - 1
            host = eng.host
            while (  # a prediction stands for a block the engine holds in no tier
                lo < n
                and (p := pred.get(blocks[lo])) is not None
                and p[0] == e
                and blocks[lo] not in host
            ):
                lo += 1
            device.append(lo)
            while lo < n and (
                blocks[lo] in host or ((p := pred.get(blocks[lo])) is not None and p[0] == e)
            ):
                lo += 1
            depths.append(lo)
        own, snap_load, snap_own = router.own, router.snap_load, router.snap_own
        loads = [own[e] + (x if (x := snap_load[e] - snap_own[e]) > 0 else 0) for e in cands]
        booked, snap_wtok, snap_booked = router.booked, router.snap_wtok, router.snap_booked
        queued = [booked[e] + (x if (x := snap_wtok[e] - snap_booked[e]) > 0 else 0) for e in cands]
        # what their KV events reported, in any tier (`BlockIndex`'s count per worker)
        cached = [len(engines[e].cache) + len(engines[e].host) - engines[e].both for e in cands]
        pool = self.pool
        room = [pool - router.room[e] for e in cands]
        block = self.block
        i, _, router.cursor = decide_tiered(
            depths, device, block, req.prompt, loads, cached, queued, room, router.cursor,
            self.tier_params,
        )  # fmt: skip
        chosen = cands[i]
        self._predict(router, blocks, depth, chosen)
        return chosen, min(depths[i] * block, req.prompt)

    def _predict(self, router: _Router, blocks: tuple[int, ...], depth: int, e: int) -> None:
        """Predict the first `PREDICTED_BLOCKS` blocks beyond what the index holds on ``e``
        (what a burst of siblings shares) for ``PRECISE.predicted_ttl_seconds``."""
        predicted = blocks[depth : depth + PREDICTED_BLOCKS]
        if not predicted:
            return
        expiry = self.now + PRECISE.predicted_ttl_seconds
        entry = (e, expiry)
        pred = router.pred
        for b in predicted:
            pred[b] = entry
        router.pred_queue.append((expiry, predicted, e))
        self.predicted = predicted

    def _llmd(self, router: _Router, req: _Request) -> tuple[int, int]:
        blocks = req.blocks
        index = router.llmd_index
        depth = self._depth(blocks, lambda b: bool(index.get(b)))
        held, cands = self._candidates(index.get(blocks[depth - 1]) if depth else None)
        n = len(blocks)
        waits = [router.snap_wait[e] for e in cands]
        qmax, qmin = max(waits), min(waits)
        best = -1.0
        chosen = cands[0]
        chosen_depth = 0
        heldset = set(held)
        rng = self.route_rng
        for e, q in zip(cands, waits, strict=True):
            if e in heldset:
                d = depth
            elif depth:
                d = self._depth(blocks[:depth], _holds(index, e))
            else:
                d = 0
            qs = 1.0 if qmax == qmin else (qmax - q) / (qmax - qmin)
            score = LLMD_PREFIX_WEIGHT * d / n + LLMD_QUEUE_WEIGHT * qs + rng.random() * 1e-9
            if score > best:
                best, chosen, chosen_depth = score, e, d
        lru = router.llmd_lru[chosen]
        cap = self.pool // self.block
        for b in reversed(blocks):  # PreRequest: the chosen pod's blocks, parents freshest
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                index.setdefault(b, set()).add(chosen)
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            h = index.get(old)
            if h is not None:
                h.discard(chosen)
                if not h:
                    del index[old]
        return chosen, min(chosen_depth * self.block, req.prompt)

    def _oracle(self, req: _Request) -> tuple[int, int]:
        blocks = req.blocks
        holders = self.holders
        depth = self._depth(blocks, holders.__contains__)
        held, cands = self._candidates(holders.get(blocks[depth - 1]) if depth else None)
        heldset = set(held)
        prompt = req.prompt
        per_tok = self.prefill_per_token
        per_att = self.prefill_per_attention
        best = math.inf
        chosen = cands[0]
        chosen_hit = 0
        for e in cands:
            eng = self.engines[e]
            if e in heldset:
                d = depth
            elif depth:
                d = self._depth(blocks[:depth], _holds(holders, e))
            else:
                d = 0
            cached = min(d * self.block, prompt - 1)
            new = prompt - cached
            queued = self.wtok[e]
            ttft = (queued + new) * per_tok + per_att * new * (cached + new / 2)
            ttft += self.decode_a[min(len(eng.run), len(self.decode_a) - 1)] * (
                1 + (ORACLE_MEMORY_PENALTY_STEPS if eng.reserved > ORACLE_FULL_POOL * self.pool
                     else 0)
            )  # fmt: skip
            if ttft < best or (ttft == best and self.load[e] < self.load[chosen]):
                best, chosen, chosen_hit = ttft, e, cached
        return chosen, chosen_hit

    def _release_router(self, req: _Request, first: bool) -> None:
        """The router hears the first token (``first``) or the end of ``req``."""
        router = self.routers[req.router]
        booked = req.booked
        if first and booked:
            router.booked[req.engine] -= booked
            req.booked = 0
            if self.peering:
                self._send_peers(req.router, req.engine, 0, -booked, (), 0)
        if not first:
            if booked:
                router.booked[req.engine] -= booked
                req.booked = 0
            router.own[req.engine] -= 1
            router.room[req.engine] -= req.prompt
            if self.peering:
                self._send_peers(req.router, req.engine, -1, -booked, (), -req.prompt)

    # --- engines --------------------------------------------------------------------------

    def _submit(self, e: _Engine, req: _Request) -> None:
        if e.state not in (READY, DRAINING, NOTICED):
            self._release_router(req, first=False)
            self._record_failure(req)
            return
        if e.phase_k:
            self._interrupt(e)
        elif not (e.run or e.prefill or e.waiting):
            e.t = self.now
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

    def _interrupt(self, e: _Engine) -> None:
        """A request arrived during a decode phase: end the phase at the step in progress."""
        dt = self.now - e.phase_t0
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

    def _schedule(self, e: _Engine) -> None:
        """Plan the engine's next event from its state at ``e.t``."""
        e.version += 1
        e.phase_k = 0
        if e.waiting:
            self._admit(e)
        prefill = e.prefill
        if prefill:
            budget = self.prefill_budget
            batch: list[tuple[_Request, int]] = []
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
            self.seq += 1  # `_push`, inline
            heapq.heappush(self.events, (e.t + dt, self.seq, _STEP, e.i, e.version))
        elif e.run:
            b = len(e.run)
            k = e.run[0][0] - e.steps
            c0 = e.ctx_p + b * e.steps - e.ctx_s
            e.phase_k, e.phase_t0, e.phase_b, e.phase_c0 = k, e.t, b, c0
            self.seq += 1
            heapq.heappush(
                self.events, (e.t + self._decode_time(k, b, c0), self.seq, _STEP, e.i, e.version)
            )
        elif e.state == DRAINING and not e.waiting:
            self._kill(e)

    def _admit(self, e: _Engine) -> None:
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
            lo, hi = 0, len(blocks) if cache else 0  # `_depth` over the cache, inline
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

    def _engine_event(self, e: _Engine) -> None:
        e.t = self.now
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

    def _first_token(self, e: _Engine, req: _Request) -> None:
        req.first = self.now
        self._release_router(req, first=True)
        self._insert(e, req.blocks, req.depth)
        if req.output <= 1:
            self._complete(e, req)
            return
        e.seq += 1
        heapq.heappush(e.run, (e.steps + req.output - 1, e.seq, req))
        e.ctx_p += req.prompt + 1
        e.ctx_s += e.steps

    def _insert(self, e: _Engine, blocks: tuple[int, ...], hint: int) -> None:
        """Cache ``blocks`` on ``e``, children first (parents are the freshest), then evict
        the least recently used blocks beyond what the pool leaves free.

        The blocks ``e`` already holds are a prefix of ``blocks`` (a holder of a block holds
        its parents), so the new ones are added from the last, then the held ones are moved
        to the end from the last: the same order as touching every block from the last to
        the first, without asking the cache about each. ``hint``: the held prefix at
        admission, still right unless blocks came or went since (two lookups tell)."""
        cache = e.cache
        holders = self.holders
        get = holders.get
        i = e.i
        n = len(blocks)
        d = hint
        if (d and blocks[d - 1] not in cache) or (d < n and blocks[d] in cache):
            d = self._depth(blocks, cache.__contains__)
        tiered = self.tiered
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
                            _hold(self.host_holders, old, i)
                    host[old] = None
                    host.move_to_end(old)
                    if len(host) > self.host_blocks:
                        gone = host.popitem(last=False)[0]
                        if tiered:
                            _unhold(self.host_holders, gone, i)
                            if gone in cache:
                                e.both -= 1
                h = get(old)
                if isinstance(h, int):
                    del holders[old]
                elif h is not None:
                    h.discard(i)
                    if not h:
                        del holders[old]

    def _finish_done(self, e: _Engine) -> None:
        run = e.run
        steps = e.steps
        while run and run[0][0] <= steps:
            finish, _, req = heapq.heappop(run)
            e.ctx_p -= req.prompt + 1
            e.ctx_s -= finish - req.output + 1  # the step it joined at
            self._complete(e, req)
        if not run:
            e.ctx_p = e.ctx_s = 0

    def _complete(self, e: _Engine, req: _Request) -> None:
        e.reserved -= req.prompt + req.output
        self.load[e.i] -= 1
        self._release_router(req, first=False)
        c = self.config
        if req.arrival < c.warmup_seconds:
            return
        res = self.result
        ttft = req.first - req.arrival
        itl = (self.now - req.first) / (req.output - 1) if req.output > 1 else 0.0
        res.completed += 1
        res.input_tokens += req.prompt
        res.output_tokens += req.output
        res.cached_tokens += req.cached
        res.host_cached_tokens += req.host_cached
        res.ttft.append(ttft)
        res.itl.append(itl)
        good = ttft <= c.slo_ttft_seconds and itl <= c.slo_itl_seconds
        if good:
            res.good_requests += 1
            res.good_input_tokens += req.prompt
            res.good_output_tokens += req.output
        self.record_outcome(req.arrival, good)

    def _record_failure(self, req: _Request) -> None:
        if req.arrival >= self.config.warmup_seconds:
            self.result.failed += 1
            self.record_outcome(req.arrival, False)


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _holds(index: Holders | dict[int, set[int]], e: int) -> Callable[[int], bool]:
    def has(block: int) -> bool:
        h = index.get(block)
        if isinstance(h, int):
            return h == e
        return h is not None and e in h

    return has


def _hold(holders: Holders, block: int, e: int) -> None:
    """``e`` holds ``block``."""
    h = holders.get(block)
    if h is None:
        holders[block] = e
    elif isinstance(h, int):
        if h != e:
            holders[block] = {h, e}
    else:
        h.add(e)


def _unhold(holders: Holders, block: int, e: int) -> None:
    """``e`` no longer holds ``block``."""
    h = holders.get(block)
    if isinstance(h, int):
        if h == e:
            del holders[block]
    elif h is not None:
        h.discard(e)
        if not h:
            del holders[block]


def run_fleet(config: FleetConfig) -> FleetResult:
    return FleetSim(config).run()
