"""Scale to zero and back: the operator's decision from the routers' demand Lease, and what a
pass does with it (spec.replicas, the Events, Ready=False ScaledToZero, Progressing=True
Activating)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fake_kube import FakeKube
from tests.fakes import VirtualClock
from tpuserve_operator import labels
from tpuserve_operator.metrics import create_operator_metrics
from tpuserve_operator.node_signals import parse_time
from tpuserve_operator.reconciler import Reconciler, ReconcilerSettings
from tpuserve_operator.render import RenderConfig
from tpuserve_operator.render.demand import DEMAND_INTERVAL_SECONDS, FRESH_RENEWALS
from tpuserve_operator.render.pod import STARTUP_BUDGET_SECONDS
from tpuserve_operator.scale_to_zero import ZeroDecision, decide_zero

pytestmark = pytest.mark.unit

T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
IDLE = 60
NAMESPACE = "ml"


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def decide(replicas: int, now: float, **marks: float | None) -> ZeroDecision:
    times = {k: (at(v) if v is not None else None) for k, v in marks.items()}
    return decide_zero(
        replicas=replicas,
        idle_seconds=IDLE,
        now=at(now),
        renewed=times.get("renewed"),
        active_since=times.get("active_since"),
        zeroed_at=times.get("zeroed_at"),
        starting_until=times.get("starting_until"),
    )


# ---- the decision ---------------------------------------------------------------------------


def test_a_fresh_renewal_at_zero_activates() -> None:
    decision = decide(0, now=100, renewed=99, zeroed_at=50)
    assert decision.action == "activate"


def test_a_renewal_from_before_the_scale_to_zero_does_not_activate() -> None:
    assert decide(0, now=100, renewed=49, zeroed_at=50).action is None


def test_a_stale_renewal_at_zero_does_not_activate() -> None:
    stale = DEMAND_INTERVAL_SECONDS * FRESH_RENEWALS + 1
    assert decide(0, now=100, renewed=100 - stale).action is None


def test_no_request_for_the_idle_period_scales_to_zero() -> None:
    decision = decide(1, now=200, renewed=200 - IDLE, active_since=10)
    assert decision.action == "scale_to_zero"
    assert "idleSeconds 60" in decision.message


def test_a_recent_request_keeps_it_up_and_says_when_to_look_again() -> None:
    decision = decide(2, now=200, renewed=190, active_since=10)
    assert decision.action is None
    assert decision.recheck_seconds == pytest.approx(IDLE - 10)


def test_a_server_just_activated_or_scaled_up_by_hand_gets_its_idle_period() -> None:
    # The last request was long ago, but the server came up 5 s ago: not idle yet.
    assert decide(1, now=1000, renewed=0, active_since=995).action is None


def test_a_starting_server_is_not_idle_until_its_startup_budget_ends() -> None:
    starting = decide(1, now=1000, renewed=0, active_since=10, starting_until=1010)
    assert starting.action is None
    assert starting.recheck_seconds == pytest.approx(10)
    budget_spent = decide(1, now=1010, renewed=0, active_since=10, starting_until=1010)
    assert budget_spent.action == "scale_to_zero"


def test_lease_times_are_read_as_kubernetes_writes_them() -> None:
    assert parse_time("2026-01-01T12:00:01.500000Z") == at(1.5)
    assert parse_time("2026-01-01T12:00:01Z") == at(1)
    assert parse_time("garbage") is None
    assert parse_time("") is None


# ---- one pass -------------------------------------------------------------------------------

SPEC = {
    "model": {"source": "hf://Qwen/Qwen3-8B"},
    "tpu": {"generation": "v6e", "topology": "2x4"},
    "engine": {"type": "simulated"},
    "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZero": {"idleSeconds": IDLE}},
}


class Fleet:
    """A reconciler on an in-memory apiserver, with a clock the test moves."""

    def __init__(self, restart_of: Fleet | None = None) -> None:
        """A new fleet, or the operator of ``restart_of`` restarted (same apiserver, clock)."""
        self.kube: FakeKube = restart_of.kube if restart_of else FakeKube()
        self.clock: VirtualClock = restart_of.clock if restart_of else VirtualClock(0.0)
        self.events: list[tuple[str, str]] = []
        self.reconciler = Reconciler(
            self.kube,
            ReconcilerSettings(render=RenderConfig()),
            create_operator_metrics(CollectorRegistry()),
            lambda body, kind, reason, message: self.events.append((kind, reason)),
            clock=lambda: at(self.clock()),
        )

        def deliver(event_type: str, body: Any) -> None:
            if body["kind"] == labels.KIND:
                self.reconciler.on_server_event(event_type, body)
            elif body["kind"] != "Pod":
                self.reconciler.on_child_event(event_type, body)

        self.kube.watch(deliver)
        self.key = (NAMESPACE, "qwen")
        if restart_of is not None:
            for name in self.kube.names("Lease"):  # the new watch lists what exists
                lease = self.kube.get_object("coordination.k8s.io/v1", "Lease", NAMESPACE, name)
                self.reconciler.on_child_event("ADDED", lease)
            return
        self.kube.put(
            {
                "apiVersion": labels.API_VERSION,
                "kind": labels.KIND,
                "metadata": {"name": "qwen", "namespace": NAMESPACE, "uid": "u", "generation": 1},
                "spec": dict(SPEC),
            }
        )

    @classmethod
    async def at_zero(cls) -> Fleet:
        """A new fleet whose server went idle and was scaled to zero."""
        fleet = cls()
        await fleet.converge()
        fleet.clock.advance(IDLE + 1)
        await fleet.converge()
        await fleet.converge()  # the new generation: at zero
        return fleet

    def body(self) -> dict[str, Any]:
        return self.kube.get_object(labels.API_VERSION, labels.KIND, *self.key)

    async def converge(self) -> float | None:
        return await self.reconciler.converge(self.key, self.body())

    def renew(self, seconds: float) -> None:
        """A router renews the demand Lease at ``seconds``."""
        lease = self.kube.get_object("coordination.k8s.io/v1", "Lease", NAMESPACE, "qwen-demand")
        lease["spec"]["renewTime"] = at(seconds).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.kube.put(lease)

    def condition(self, type_: str) -> tuple[str, str]:
        found = next(c for c in self.body()["status"]["conditions"] if c["type"] == type_)
        return found["status"], found["reason"]


async def test_an_idle_server_goes_to_zero_and_the_next_request_brings_it_back() -> None:
    fleet = Fleet()
    recheck = await fleet.converge()
    assert recheck is not None
    assert recheck <= IDLE + 1
    assert fleet.kube.names("Lease") == ["qwen-demand"]

    fleet.clock.advance(IDLE / 2)
    fleet.renew(IDLE / 2)  # a request: the idle period starts again
    fleet.clock.advance(IDLE - 1)
    await fleet.converge()
    assert fleet.kube.replica_patches == []

    fleet.clock.advance(2)
    await fleet.converge()
    assert fleet.kube.replica_patches == [0]
    assert ("Normal", "ScaledToZero") in fleet.events
    await fleet.converge()  # the new generation: at zero, idle
    assert fleet.condition("Ready") == ("False", "ScaledToZero")
    assert fleet.kube.replica_patches == [0]

    fleet.clock.advance(600)
    fleet.renew(fleet.clock())  # a router holds a request
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 1]
    assert ("Normal", "Activating") in fleet.events
    await fleet.converge()
    assert fleet.condition("Progressing") == ("True", "Activating")
    assert fleet.condition("Ready") == ("False", "NoReadyReplicas")


async def test_a_server_without_scale_to_zero_is_never_scaled_by_the_operator() -> None:
    fleet = Fleet()
    body = fleet.body()
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    body["metadata"]["generation"] = 2
    fleet.kube.put(body)
    await fleet.converge()
    fleet.clock.advance(10 * IDLE)
    await fleet.converge()
    assert fleet.kube.replica_patches == []
    assert fleet.kube.names("Lease") == []


async def test_an_activated_server_still_compiling_is_not_scaled_to_zero() -> None:
    fleet = await Fleet.at_zero()
    fleet.clock.advance(10)
    fleet.renew(fleet.clock())
    await fleet.converge()
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 1]

    budget = STARTUP_BUDGET_SECONDS["simulated"]
    fleet.clock.advance(budget - 1)  # held requests timed out long ago; still compiling
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 1]

    fleet.clock.advance(2)  # it never started: the startup budget is spent
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 1, 0]


async def test_renewals_are_timed_by_the_operator_clock_not_the_routers() -> None:
    fleet = await Fleet.at_zero()
    assert fleet.kube.replica_patches == [0]

    fleet.clock.advance(600)
    fleet.renew(fleet.clock() - 3600)  # the router's clock is an hour behind
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 1]


async def test_a_lease_first_seen_after_an_operator_restart_is_not_demand() -> None:
    fleet = await Fleet.at_zero()
    fleet.clock.advance(600)
    fleet.renew(fleet.clock() - 1)  # renewed while no operator ran (a restart)
    restarted = Fleet(restart_of=fleet)
    await restarted.converge()
    assert fleet.kube.replica_patches == [0]


async def test_a_replicas_write_racing_the_operators_own_does_not_wedge_it() -> None:
    fleet = Fleet()
    await fleet.converge()
    fleet.clock.advance(IDLE + 1)
    stale = fleet.body()
    await fleet.reconciler.converge(fleet.key, stale)
    assert fleet.kube.replica_patches == [0]
    body = fleet.body()  # someone scales it by hand before the operator sees its own change
    body["spec"]["replicas"] = 2
    body["metadata"]["generation"] += 1
    fleet.kube.put(body)
    await fleet.converge()
    fleet.clock.advance(IDLE + 1)
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 0]  # idle again: the operator still decides


async def test_turning_scale_to_zero_off_at_zero_brings_the_server_back_up() -> None:
    fleet = Fleet()
    await fleet.converge()
    fleet.clock.advance(IDLE + 1)
    await fleet.converge()
    assert fleet.body()["metadata"]["annotations"] == {labels.SCALED_TO_ZERO: "true"}
    body = fleet.body()
    body["spec"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 4}
    body["metadata"]["generation"] += 1
    fleet.kube.put(body)
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 2]
    assert labels.SCALED_TO_ZERO not in fleet.body()["metadata"].get("annotations", {})
    await fleet.converge()
    assert fleet.kube.replica_patches == [0, 2]


async def test_a_server_set_to_zero_by_hand_stays_there() -> None:
    fleet = Fleet()
    body = fleet.body()
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    body["spec"]["replicas"] = 0
    fleet.kube.put(body)
    await fleet.converge()
    assert fleet.kube.replica_patches == []


async def test_zero_without_a_router_is_refused_until_a_gateway_selects_the_server() -> None:
    fleet = Fleet()
    body = fleet.body()
    body["spec"]["router"] = {"enabled": False}
    body["metadata"]["labels"] = {"tier": "shared"}
    fleet.kube.put(body)
    await fleet.converge()
    assert fleet.condition("Valid") == ("False", "InvalidSpec")
    message = next(c for c in fleet.body()["status"]["conditions"] if c["type"] == "Valid")
    assert "spec.autoscaling.minReplicas: 0 needs" in message["message"]
    assert "TPUGateway" in message["message"]
    assert fleet.kube.names("Lease") == []

    gateway: dict[str, Any] = {
        "apiVersion": labels.API_VERSION,
        "kind": labels.GATEWAY_KIND,
        "metadata": {"name": "models", "namespace": NAMESPACE},
        "spec": {"serverSelector": {"matchLabels": {"tier": "other"}}},
    }
    fleet.kube.put(gateway)  # selects other servers: still refused
    await fleet.converge()
    assert fleet.condition("Valid")[0] == "False"

    gateway["spec"]["serverSelector"]["matchLabels"] = {"tier": "shared"}
    fleet.kube.put(gateway)
    await fleet.converge()
    assert fleet.condition("Valid")[0] == "True"
    assert fleet.kube.names("Lease") == ["qwen-demand"]  # the gateway renews it
    fleet.clock.advance(IDLE + 1)
    await fleet.converge()
    assert fleet.kube.replica_patches == [0]  # and the operator scales on it as before
