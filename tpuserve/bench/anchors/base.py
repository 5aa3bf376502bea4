"""What an anchor policy is given, and the registry of anchors by name.

Anchors implement the router's `Policy` protocol (``choose`` plus the hooks), so the
benchmark drives them exactly as it drives tpuserve's own policies. Some anchors read engine
state a real deployment gets from scraped metrics (llm-d's queue and KV-usage scorers) or
cannot get at all (the oracle): they receive it as `EngineView`s, which only the in-process
(sim) mode can provide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sglang_tpu.perf_model import StepTimer
from tpuserve_router.policies.base import Clock, Policy


class EngineView(Protocol):
    """The engine state anchors may read (`sglang_tpu.sim.engine.EngineCore` conforms)."""

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def token_usage(self) -> float: ...

    def match_prefix_length(self, token_ids: Sequence[int]) -> int: ...


@dataclass(frozen=True)
class AnchorContext:
    clock: Clock
    seed: int
    timer: StepTimer
    page_size: int
    engines: Mapping[str, EngineView] | None = None
    """Worker name -> its engine; None when the engines run out of process (live mode)."""
    cache_tokens: int = 0
    """Each engine's KV pool in tokens (policies that model the engine's cache use it)."""


AnchorFactory = Callable[[AnchorContext], Policy]


@dataclass(frozen=True)
class Anchor:
    name: str
    summary: str
    factory: AnchorFactory
    needs_engines: bool = False


class AnchorUnavailable(ValueError):
    """The anchor needs something this mode cannot give (e.g. engine state in live mode)."""
