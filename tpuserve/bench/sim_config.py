"""Mode sim's settings and result: `SimConfig` (the fleet of engine twins, the router replicas
and what they read, the faults to inject, each checked with the flag it comes from), `Fault`,
`SimResult` (the records, load samples and faults of one run) and `FAILURE_REASONS` (why a
request failed). `sim_runner` runs them."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from sglang_tpu.perf_model import StepTimer, get_profile
from sglang_tpu.topology import lookup
from tpuserve.bench.report import SLO_FACTOR, LoadSamples, RequestRecord
from tpuserve_router.config import RouterConfig

log = logging.getLogger(__name__)


FAILURE_REASONS = {
    "no_healthy_worker": "the policy found no routable worker (the router answers 503)",
    "prompt_too_long": "the prompt has at least the engine's context length of tokens "
    "(the engine answers 400)",
    "queue_full": "the engine's waiting queue was full (the engine answers 503)",
    "worker_restarted": "the worker restarted while the request ran (--fault restart)",
    "not_finished": "the run ended before the request finished (its worker never served it)",
}
"""Why a request failed in mode sim: the ``error`` of its record, one of these keys."""


@dataclass(frozen=True)
class Fault:
    kind: str  # "restart" | "flush"
    at: float
    worker: int = 0

    def validate(self, workers: int) -> None:
        if self.kind not in ("restart", "flush"):
            raise ValueError(f"--fault: {self.kind!r} is not allowed; allowed: restart, flush")
        if not 0 <= self.worker < workers:
            raise ValueError(
                f"--fault-worker: {self.worker} is not allowed; allowed: 0..{workers - 1}"
            )
        if self.at < 0:
            raise ValueError(f"--fault-at: {self.at} is not allowed; allowed: >= 0")


@dataclass(frozen=True)
class SimConfig:
    workers: int = 4
    cache_tokens: int = 100_000
    page_size: int = 16
    tpu: str = "v6e"
    topology: str = "1x1"
    model_profile: str = "llama-3.1-8b"
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    max_queued_requests: int = 100_000
    seed: int = 0
    kv_event_drop: float = 0.0
    kv_events: bool = True
    """Feed the engines' KV events to a policy with a block index (``tpuserve router
    --kv-events``); False models a router started without it."""
    faults: tuple[Fault, ...] = ()
    restart_down_seconds: float = 5.0
    slo_factor: float = SLO_FACTOR
    router_replicas: int = 1
    load_poll_seconds: float = RouterConfig.load_poll_interval_seconds
    """How often a tpuserve policy's replicas poll the engines' load (0: never), as
    ``tpuserve router --load-poll-interval``."""
    peer_delay_seconds: float | None = None
    """A tpuserve policy's replicas peer (``tpuserve router --peer-port``), each hearing the
    others' announcements this long after the event; None: no peering."""
    host_cache_tokens: int = 0
    """Each engine's host-memory KV tier in tokens (SGLang's HiCache, write-through; 0: HBM
    only; docs/host-kv-tier.md). With a tier the router's index is told each engine's HBM pool
    (``cache_tokens``), as the router reads it from ``/server_info`` (`BlockIndex.
    set_worker_limit`: `precise` checks HBM room against it). Without one it is not: the
    twin's event stream of a full pool briefly claims more blocks than the pool holds (W4
    with 16,384-token pools: 1,386 blocks), which that limit would drop, and the published
    HBM-only figures were measured without it."""
    kv_tiers: bool = True
    """The router reads the KV events' medium (`tpuserve_router.kv.block_index`'s tiers); False
    models a tier-blind router, to which any ``BlockRemoved`` removes the block."""
    kv_event_interval_seconds: float = 0.0
    """How often a replica reads a busy engine's KV events, as the router does every
    `tpuserve_router.kv.kv_events.READ_INTERVAL_SECONDS`: an event reaches a replica's index at
    that replica's next read (replica r reads at phase r / N of the interval); 0: at once."""

    @property
    def context_length(self) -> int:
        """The engines' context length, as ``tpuserve engine sim`` chooses it when not told:
        the model's, at most the KV pool."""
        return min(get_profile(self.model_profile).context_length, self.cache_tokens)

    def validate(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers: {self.workers} is not allowed; allowed: >= 1")
        if self.cache_tokens < self.page_size:
            raise ValueError(
                f"--cache-tokens: {self.cache_tokens} is not allowed; allowed: >= the page size"
            )
        if not 0.0 <= self.kv_event_drop < 1.0:
            raise ValueError(
                f"--kv-event-drop: {self.kv_event_drop} is not allowed; allowed: 0 <= p < 1"
            )
        if self.router_replicas < 1:
            raise ValueError(
                f"--router-replicas: {self.router_replicas} is not allowed; allowed: >= 1"
            )
        if not self.load_poll_seconds >= 0:
            raise ValueError(
                f"--load-poll-interval: {self.load_poll_seconds} is not allowed; allowed: >= 0"
            )
        if self.peer_delay_seconds is not None and not 0 <= self.peer_delay_seconds < math.inf:
            raise ValueError(
                f"--peer-delay: {self.peer_delay_seconds} is not allowed; allowed: >= 0 seconds"
            )
        if not 0 <= self.kv_event_interval_seconds < math.inf:
            raise ValueError(
                f"--kv-event-interval: {self.kv_event_interval_seconds} is not allowed; "
                "allowed: >= 0 seconds"
            )
        for fault in self.faults:
            fault.validate(self.workers)


def make_timer(config: SimConfig) -> StepTimer:
    return StepTimer(lookup(config.tpu, config.topology), get_profile(config.model_profile))


@dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    samples: LoadSamples
    config: SimConfig
    wall_seconds: float
    virtual_seconds: float
    rejected: int = 0
    faults: list[dict[str, Any]] = field(default_factory=list)
    """Per fault: kind, worker index, ``at`` and ``serving_again_at`` (None: never)."""
    meta: dict[str, Any] = field(default_factory=dict)
