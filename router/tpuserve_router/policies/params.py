"""The parameters of the prefix policies (`prefix_routing`, `precise`), validated by
`base.build_params`.

A module of their own, interpreted: a policy's parameters combine several of these
dataclasses, and mypyc's compiled classes (`tpuserve_router.compiled`) take one base.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class IndexParams:
    """Parameters of a policy's `BlockIndex` (see `tpuserve_router.block_index`)."""

    page_size: int = 16
    predicted_ttl_seconds: float = 2.0
    approximate_ttl_seconds: float = 120.0
    max_predicted_blocks: int = 2**18

    def validate(self) -> str | None:
        if self.page_size < 1:
            return f"page_size={self.page_size} must be >= 1"
        if self.predicted_ttl_seconds < 0:
            return f"predicted_ttl_seconds={self.predicted_ttl_seconds} must be >= 0"
        if self.approximate_ttl_seconds < 0:
            return f"approximate_ttl_seconds={self.approximate_ttl_seconds} must be >= 0"
        if self.max_predicted_blocks < 0:
            return f"max_predicted_blocks={self.max_predicted_blocks} must be >= 0"
        return None


@dataclass(frozen=True)
class PreciseParams(AffinityParams, IndexParams, QueueParams):
    def validate(self) -> str | None:
        return (
            AffinityParams.validate(self)
            or IndexParams.validate(self)
            or QueueParams.validate(self)
        )
