"""LoRA adapter affinity: an adapter's requests prefer the replicas that served it lately,
as long as that keeps the load balanced.

An SGLang replica keeps at most ``--max-loras-per-batch`` adapters (8 by default) in its
LoRA memory pool on the accelerator, evicting the least recently used; a request for an
adapter not in the pool waits for its weights to be copied in. Every replica that lists an
adapter loaded (its ``/v1/models``; `WorkerRegistry.route`) can serve it, so the router
remembers the last `WARM_ADAPTERS` adapters it sent each replica ("warm") and narrows an
adapter's candidates to the warm ones. Affinity yields to load as prefix affinity does:
when the least loaded warm replica carries more than ``abs_threshold`` requests above the
least loaded candidate and more than ``rel_threshold`` times as many (`is_imbalanced`), or
no warm replica is routable, every candidate stays in. The policy then chooses among what is
left as usual (prefix match and load), and the chosen replica becomes warm.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from tpuserve_router.engines.workers import Worker
from tpuserve_router.policies.base import in_flight_of, is_imbalanced

WARM_ADAPTERS: Final = 8
"""Adapters remembered per replica: SGLang's default ``--max-loras-per-batch``."""


class AdapterAffinity:
    """Which adapters each replica served lately, and the candidates that follows."""

    def __init__(self, abs_threshold: int = 8, rel_threshold: float = 1.5) -> None:
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold
        self._warm: dict[str, OrderedDict[str, None]] = {}  # worker name -> adapters, LRU

    def candidates(self, adapter: str, workers: list[Worker]) -> list[Worker]:
        """The replicas of ``workers`` an ``adapter`` request should choose among."""
        healthy = [w for w in workers if w.healthy]
        warm = [w for w in healthy if adapter in self._warm.get(w.name, ())]
        if not warm or len(warm) == len(healthy):
            return workers
        least_warm = min(warm, key=in_flight_of)
        least = min(healthy, key=in_flight_of)
        if is_imbalanced((least, least_warm), self.abs_threshold, self.rel_threshold):
            return workers
        return warm

    def routed(self, adapter: str, worker: str) -> None:
        """``adapter`` was sent to ``worker``: it is warm there now."""
        warm = self._warm.setdefault(worker, OrderedDict())
        warm[adapter] = None
        warm.move_to_end(adapter)
        while len(warm) > WARM_ADAPTERS:
            warm.popitem(last=False)

    def forget(self, worker: str) -> None:
        """``worker`` left or restarted: nothing is warm there."""
        self._warm.pop(worker, None)
