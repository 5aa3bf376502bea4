"""The hold queue: arrival order, the bound, the hold time, and clients that leave."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes import VirtualClock
from tests.waiting import eventually_async
from tpuserve_router.hold import OTHER_MODEL, HoldQueues, HoldRefused, hold_label
from tpuserve_router.metrics import RouterMetrics, create_router_metrics

pytestmark = pytest.mark.unit

MODEL = "m"


@dataclass
class Setup:
    max_requests: int = 8
    max_seconds: float = 60.0
    clock: VirtualClock = field(default_factory=VirtualClock)
    routable: bool = False
    metrics: RouterMetrics = field(
        default_factory=lambda: create_router_metrics(CollectorRegistry())
    )

    def __post_init__(self) -> None:
        self.queues = HoldQueues(self.max_requests, self.max_seconds, self.metrics, self.clock)

    def hold(self, label: str = MODEL) -> asyncio.Task[None]:
        return asyncio.ensure_future(self.queues.hold(label, self.clock(), lambda: self.routable))

    def count(self, outcome: str, label: str = MODEL) -> float:
        value = self.metrics.registry.get_sample_value(
            "tpuserve_router_hold_outcomes_total", {"model": label, "outcome": outcome}
        )
        return value or 0.0

    def gauge(self, label: str = MODEL) -> float:
        value = self.metrics.registry.get_sample_value(
            "tpuserve_router_held_requests", {"model": label}
        )
        return value or 0.0


async def test_held_requests_leave_in_arrival_order_once_a_worker_is_routable() -> None:
    setup = Setup()
    order: list[int] = []

    async def one(i: int) -> None:
        await setup.queues.hold(MODEL, setup.clock(), lambda: setup.routable)
        order.append(i)

    tasks = [asyncio.ensure_future(one(i)) for i in range(5)]
    await eventually_async(lambda: setup.queues.held(MODEL) == 5, what="5 held")
    assert setup.gauge() == 5
    assert order == []
    setup.routable = True
    setup.queues.announce()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert setup.count("dispatched") == 5
    assert setup.gauge() == 0
    assert setup.queues.total == 0


async def test_a_full_queue_refuses_the_newcomer_at_once() -> None:
    setup = Setup(max_requests=2)
    held = [setup.hold(), setup.hold()]
    await eventually_async(lambda: setup.queues.held(MODEL) == 2, what="2 held")
    with pytest.raises(HoldRefused) as refused:
        await setup.queues.hold(MODEL, setup.clock(), lambda: False)
    assert refused.value.outcome == "queue_full"
    assert "--hold-max-requests 2" in str(refused.value)
    assert setup.count("queue_full") == 1
    other = setup.hold("another-model")  # each model has its own bound
    await eventually_async(lambda: setup.queues.held("another-model") == 1, what="held")
    setup.routable = True
    setup.queues.announce()
    await asyncio.gather(*held, other)


async def test_a_request_held_past_the_hold_time_is_refused() -> None:
    setup = Setup(max_seconds=30.0)
    first = setup.hold()
    await eventually_async(lambda: setup.queues.held(MODEL) == 1, what="held")
    setup.clock.advance(31.0)
    setup.queues.announce()  # wakes the head, which finds its time is up
    with pytest.raises(HoldRefused) as refused:
        await first
    assert refused.value.outcome == "timeout"
    assert setup.count("timeout") == 1
    assert setup.queues.total == 0


async def test_a_client_that_leaves_is_removed_and_the_next_moves_up() -> None:
    setup = Setup()
    leaving, staying = setup.hold(), setup.hold()
    await eventually_async(lambda: setup.queues.held(MODEL) == 2, what="2 held")
    leaving.cancel()
    await eventually_async(lambda: setup.queues.held(MODEL) == 1, what="1 held")
    assert setup.count("client_gone") == 1
    setup.routable = True
    setup.queues.announce()
    await staying
    assert setup.count("dispatched") == 1


async def test_only_the_head_may_leave_so_a_late_request_cannot_overtake() -> None:
    setup = Setup()
    order: list[str] = []

    async def one(name: str, routable: bool) -> None:
        await setup.queues.hold(MODEL, setup.clock(), lambda: routable)
        order.append(name)

    head = asyncio.ensure_future(one("head", False))  # its worker is not there yet
    await eventually_async(lambda: setup.queues.held(MODEL) == 1, what="held")
    late = asyncio.ensure_future(one("late", True))
    await eventually_async(lambda: setup.queues.held(MODEL) == 2, what="2 held")
    setup.queues.announce()
    await asyncio.sleep(0)
    assert order == []  # the late one waits behind the head
    head.cancel()
    await late
    assert order == ["late"]


def test_unknown_models_share_one_bounded_label() -> None:
    assert hold_label("served", {"served"}) == "served"
    assert hold_label("typo", {"served"}) == OTHER_MODEL
    assert hold_label("", {"served"}) == OTHER_MODEL
