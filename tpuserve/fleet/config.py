"""The fleet model's configuration: every knob of `FleetSim` and its checks, the daily shape.

`FleetConfig` holds what a run is (slice, model, policy, fleet size, traffic, autoscaler,
Spot, SLOs); `validate` names the field, the value and what is allowed. The module docstring
of `tpuserve.fleet.model` says what each part models.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields
from typing import Any

from sglang_tpu.perf_model import ENGINES, ModelProfile, get_profile
from sglang_tpu.topology import CatalogError, SliceShape, lookup
from tpuserve.bench.mooncake import MOONCAKE_BLOCK_TOKENS
from tpuserve_operator import scaling_behavior
from tpuserve_operator.scaling_behavior import Behavior

BLOCK_TOKENS = MOONCAKE_BLOCK_TOKENS
FLEET_POLICIES = ("round_robin", "precise", "llmd", "oracle")
"""The policies the fleet model routes with (`tpuserve.fleet.routers`)."""
WORKLOADS = ("mooncake", "lengths")


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
    """A model profile not in the catalog (from a config.json); None: ``model``'s."""
    engine: str = "sglang"
    """Whose step times (`perf_model.ENGINES`): SGLang's (the twin's), or SGLang-JAX's
    (`sglang_tpu.sgl_jax_steps`: its host terms and padding)."""
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
