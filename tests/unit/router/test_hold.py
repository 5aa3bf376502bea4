"""The hold queue: arrival order, the bound, the hold time, and clients that leave."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes import VirtualClock
from tests.waiting import eventually_async
from tpuserve_router.metrics import RouterMetrics, create_router_metrics
from tpuserve_router.tenancy.hold import OTHER_MODEL, HoldQueues, HoldRefused, hold_label

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


class Tenants:
    """Requests of named tenants and classes held in one queue, and the order they leave."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.order: list[str] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.room = True  # what `admissible()` answers

    async def hold(self, name: str, tenant: str, priority: str = "normal", size: int = 0) -> None:
        """Hold ``name``, and wait until it is held (or refused)."""
        setup = self.setup

        async def one() -> None:
            await setup.queues.hold(
                MODEL, setup.clock(), lambda: setup.routable, tenant=tenant,
                priority=priority, size=size, admissible=lambda: self.room,
            )  # fmt: skip
            self.order.append(name)

        self.tasks[name] = asyncio.ensure_future(one())
        await asyncio.sleep(0)  # the task runs to its first wait: held, or refused

    async def close(self) -> None:
        """Cancel what is still held."""
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def outcome(self, name: str) -> str:
        try:
            await self.tasks[name]
        except HoldRefused as refused:
            return refused.outcome
        return "dispatched"


async def test_a_critical_request_takes_the_place_of_the_newest_low_one_in_a_full_queue() -> None:
    setup = Setup(max_requests=3)
    held = Tenants(setup)
    for i in range(3):
        await held.hold(f"low{i}", "batch", "low")
    await held.hold("critical", "acme", "critical")
    assert await held.outcome("low2") == "preempted"
    assert setup.count("preempted") == 1
    assert setup.queues.held(MODEL) == 3
    with pytest.raises(HoldRefused) as refused:  # nor push out its own tenant's, nor critical
        await setup.queues.hold(MODEL, setup.clock(), lambda: True, tenant="batch", priority="low")
    assert refused.value.outcome == "queue_full"
    setup.routable = True
    setup.queues.announce()
    await asyncio.gather(*(held.tasks[n] for n in ("low0", "low1", "critical")))
    assert held.order == ["critical", "low0", "low1"]  # the most important class first


async def test_one_tenant_keeps_no_more_than_its_share_of_a_full_queue() -> None:
    setup = Setup(max_requests=4)
    held = Tenants(setup)
    for i in range(4):
        await held.hold(f"a{i}", "flooder")
    await held.hold("b0", "other")  # flooder 4, other 0: a3 gives way
    await held.hold("b1", "other")  # flooder 3, other 1: a2 gives way
    assert [await held.outcome(n) for n in ("a3", "a2")] == ["preempted", "preempted"]
    await held.hold("b2", "other")  # flooder 2, other 2: its share; refused
    assert await held.outcome("b2") == "queue_full"
    assert setup.queues.held(MODEL) == 4
    await held.close()


async def test_tenants_take_turns_at_wake_up_and_each_leaves_in_arrival_order() -> None:
    setup = Setup()
    held = Tenants(setup)
    for i in range(4):
        await held.hold(f"a{i}", "flooder", "low")
    for i in range(2):
        await held.hold(f"b{i}", "small", "low")
    await held.hold("c0", "vip", "high")
    setup.routable = True
    setup.queues.announce()
    await asyncio.gather(*held.tasks.values())
    assert held.order == ["c0", "a0", "b0", "a1", "b1", "a2", "a3"]


async def test_a_held_request_leaves_only_while_its_class_would_be_admitted() -> None:
    setup = Setup(routable=True)
    held = Tenants(setup)
    held.room = False  # the router is at its in-flight limit for this class
    await held.hold("waits", "acme")
    setup.queues.announce()
    await asyncio.sleep(0)
    assert held.order == []  # held, not refused
    held.room = True
    setup.queues.announce()  # a request left the router
    await held.tasks["waits"]
    assert held.order == ["waits"]


async def test_held_bodies_are_bounded_in_bytes_across_queues() -> None:
    setup = Setup()
    setup.queues.max_bytes = 100
    held = Tenants(setup)
    await held.hold("big", "flooder", size=60)
    await held.hold("too-big", "small", size=101)
    assert await held.outcome("too-big") == "queue_full"  # larger than the bound itself
    await held.hold("fits", "small", size=40)
    assert setup.queues.held_bytes == 100
    await held.hold("more", "small", size=10)  # flooder would keep 0 < small's 50: refused
    assert await held.outcome("more") == "queue_full"
    await held.hold("critical", "ops", "critical", size=50)  # takes the place of big
    assert await held.outcome("big") == "preempted"
    assert setup.queues.held_bytes == 90
    await held.close()


async def test_one_models_held_bodies_take_at_most_its_share_of_the_bytes() -> None:
    setup = Setup()
    queues = HoldQueues(8, 60.0, setup.metrics, setup.clock, max_bytes=100, model_share=0.5)
    outcomes: dict[str, str] = {}

    async def hold(name: str, model: str, size: int) -> None:
        try:
            await queues.hold(model, setup.clock(), lambda: False, tenant=name, size=size)
        except HoldRefused as refused:
            outcomes[name] = refused.outcome

    tasks = [asyncio.ensure_future(hold("f1", "flood", 30))]
    await asyncio.sleep(0)
    tasks.append(asyncio.ensure_future(hold("f2", "flood", 30)))  # 60 > the model's 50
    await asyncio.sleep(0)
    assert outcomes == {"f2": "queue_full"}
    assert queues.held("flood") == 1
    tasks.append(asyncio.ensure_future(hold("quiet", "quiet", 50)))  # its own share is whole
    await asyncio.sleep(0)
    assert queues.held("quiet") == 1
    assert queues.held_bytes == 80
    assert "quiet" not in outcomes
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
