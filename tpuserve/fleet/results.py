"""What a fleet run measured (`FleetResult`) and its summary."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from tpuserve.fleet.config import FleetConfig


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
    request_seconds: float = 0.0
    """Arrival to last token, summed over the counted finished requests: over the window,
    the mean requests in the fleet (Little's law; `tpuserve plan`'s concurrency)."""

    @property
    def window_seconds(self) -> float:
        return self.config.duration_seconds - self.config.warmup_seconds

    def percentile(self, values: array[float], q: float) -> float | None:
        return percentile_of(sorted(values), q)

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
            "ttft_p50": percentile_of(ttft, 0.5),
            "ttft_p99": percentile_of(ttft, 0.99),
            "itl_p50": percentile_of(itl, 0.5),
            "itl_p99": percentile_of(itl, 0.99),
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


def percentile_of(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
