"""LoRA adapter affinity: warm replicas first, unless that unbalances the load."""

from __future__ import annotations

import pytest

from tpuserve_router.engines.workers import Worker, WorkerSpec
from tpuserve_router.pipeline.adapter_affinity import WARM_ADAPTERS, AdapterAffinity

pytestmark = pytest.mark.unit


def replicas(*loads: int) -> list[Worker]:
    workers = []
    for i, load in enumerate(loads):
        worker = Worker(WorkerSpec(f"http://w{i}:1", model="llama"))
        worker.health_ok = worker.healthy = True
        worker.in_flight = load
        workers.append(worker)
    return workers


def test_an_adapter_prefers_the_replicas_that_served_it() -> None:
    affinity = AdapterAffinity(abs_threshold=4, rel_threshold=1.5)
    a, b, c = replicas(0, 0, 0)
    assert affinity.candidates("sql", [a, b, c]) == [a, b, c]  # cold everywhere
    affinity.routed("sql", b.name)
    assert affinity.candidates("sql", [a, b, c]) == [b]
    assert affinity.candidates("chat", [a, b, c]) == [a, b, c]


def test_affinity_yields_to_load() -> None:
    affinity = AdapterAffinity(abs_threshold=4, rel_threshold=1.5)
    a, b = replicas(0, 4)
    affinity.routed("sql", b.name)
    assert affinity.candidates("sql", [a, b]) == [b]  # 4 more is within the threshold
    b.in_flight = 5
    assert affinity.candidates("sql", [a, b]) == [a, b]  # the warm one is overloaded
    b.healthy = False
    assert affinity.candidates("sql", [a, b]) == [a, b]  # no routable warm replica


def test_a_replica_remembers_its_recent_adapters_only() -> None:
    affinity = AdapterAffinity()
    a, b = replicas(0, 0)
    affinity.routed("first", a.name)
    for i in range(WARM_ADAPTERS):
        affinity.routed(f"adapter-{i}", a.name)
    assert affinity.candidates("first", [a, b]) == [a, b]  # evicted, as SGLang's LRU pool
    assert affinity.candidates("adapter-0", [a, b]) == [a]
    affinity.forget(a.name)
    assert affinity.candidates("adapter-0", [a, b]) == [a, b]
