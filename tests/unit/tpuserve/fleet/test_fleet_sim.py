"""The fleet model (`tpuserve.fleet`): deterministic, bounded, and its inputs checked."""

from __future__ import annotations

import gc
import math
from dataclasses import replace

import pytest

from tpuserve.fleet import FLEET_POLICIES, FleetConfig, FleetSim, daily_multiplier, run_fleet
from tpuserve.fleet.request import Request
from tpuserve.fleet.routers import RouterReplica
from tpuserve_operator import scaling_behavior

pytestmark = pytest.mark.unit

SMALL = FleetConfig(replicas=6, peak_rate=12.0, duration_seconds=120.0, router_replicas=2,
                    bursts_per_hour=30.0)  # fmt: skip


@pytest.mark.parametrize("policy", FLEET_POLICIES)
def test_same_seed_same_result_and_every_request_accounted(policy: str) -> None:
    a = run_fleet(replace(SMALL, policy=policy)).summary()
    b = run_fleet(replace(SMALL, policy=policy)).summary()
    a.pop("wall_seconds")
    b.pop("wall_seconds")
    assert a == b
    assert a["requests"] > 100
    assert a["completed"] + a["failed"] + a["unfinished"] == a["requests"]
    assert 0.0 <= a["cache_hit_rate"] < 1.0
    assert 0.0 <= a["goodput_share"] <= 1.0
    assert a["mean_chips"] == pytest.approx(6 * 4)


def test_preemptions_fail_requests_and_slices_come_back() -> None:
    config = replace(SMALL, preemptions_per_replica_hour=60.0, cold_start_seconds=(5.0, 10.0))
    s = run_fleet(config).summary()
    assert s["preemptions"] > 0
    assert s["completed"] + s["failed"] + s["unfinished"] == s["requests"]
    assert s["replicas_min"] < 6


def test_autoscaler_scales_up_from_one_replica_within_bounds() -> None:
    config = replace(
        SMALL, autoscale=True, initial_replicas=1, min_replicas=1, peak_rate=20.0,
        target_tokens_per_chip=5_000.0, cold_start_seconds=(10.0, 20.0),
    )  # fmt: skip
    s = run_fleet(config).summary()
    assert s["scale_ups"] > 0
    assert 1 < s["replicas_max"] <= config.replicas  # it grew from one, never past the bound


def test_prefix_policies_hit_the_cache_more_than_round_robin() -> None:
    rr = run_fleet(replace(SMALL, policy="round_robin")).summary()
    precise = run_fleet(replace(SMALL, policy="precise")).summary()
    assert precise["cache_hit_rate"] > rr["cache_hit_rate"]


@pytest.mark.parametrize("policy", FLEET_POLICIES)
def test_the_model_makes_no_reference_cycles(policy: str) -> None:
    """`FleetSim.run` pauses the cyclic garbage collector: reference counting must free
    everything a run makes (sessions, requests, caches, slices killed and restarted)."""
    config = replace(SMALL, policy=policy, autoscale=True, initial_replicas=3,
                     preemptions_per_replica_hour=60.0, cold_start_seconds=(5.0, 10.0))  # fmt: skip
    gc.collect()
    assert gc.isenabled()
    try:
        gc.disable()
        run_fleet(config)
        assert not gc.isenabled()  # left as it found it
        assert gc.collect() == 0  # nothing unreachable was left to a collection
        gc.enable()
        run_fleet(config)
        assert gc.isenabled()
    finally:
        gc.enable()


def _watched(sim: FleetSim, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Notes, at each decision, whether the deciding router's in-flight counts are the
    engines' (running + waiting): [decisions, exact ones]."""
    counts = [0, 0]
    route = sim.routing.route

    def watched(router: RouterReplica, req: Request) -> tuple[int, int]:
        counts[0] += 1
        if router.own == sim.slots.load:
            counts[1] += 1
        return route(router, req)

    monkeypatch.setattr(sim.routing, "route", watched)
    return counts


def test_peering_routers_share_in_flight_counts_and_it_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Peering at no delay: every router counts every router's requests on each engine, as one
    router would; at 1 ms (the default) nearly so; without peering, only its own."""
    config = replace(SMALL, policy="precise", router_replicas=4, peak_rate=30.0)
    assert config.peer_delay_seconds == pytest.approx(0.001)
    shares = {}
    for delay in (0.0, 0.001, None):
        sim = FleetSim(replace(config, peer_delay_seconds=delay))
        decisions = _watched(sim, monkeypatch)
        s = sim.run().summary()
        assert s["peer_delay_seconds"] == delay
        assert s["completed"] + s["failed"] + s["unfinished"] == s["requests"]
        assert decisions[0] > 100
        shares[delay] = decisions[1] / decisions[0]
        assert s["unfinished"] == 0
        sim.now = math.inf  # the last ends heard: every count and booking back to zero
        sim.routing.deliver_peer_messages()
        assert all(r.own == [0] * 6 and r.booked == [0] * 6 for r in sim.routers)
    assert shares[0.0] == 1.0
    assert 0.5 < shares[0.001] < 1.0
    assert shares[None] < 0.5
    # One router has no peer: the same run whether peering is on or off.
    one = replace(config, router_replicas=1)
    a = run_fleet(one).summary()
    b = run_fleet(replace(one, peer_delay_seconds=None)).summary()
    for s in (a, b):
        s.pop("wall_seconds")
        s.pop("peer_delay_seconds")
    assert a == b


def test_daily_shape() -> None:
    assert daily_multiplier(3.0, 0.35) == pytest.approx(0.35)
    assert daily_multiplier(15.0, 0.35) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"policy": "random"}, "policy: 'random' is not allowed; allowed: round_robin"),
        ({"replicas": 0}, "replicas: 0 is not allowed; allowed: >= 1"),
        ({"topology": "3x3"}, "3x3"),
        ({"model": "gpt-9"}, "model: 'gpt-9' is not allowed"),
        ({"peak_rate": 0.0}, "peak_rate: 0.0 is not allowed; allowed: > 0 and finite"),
        ({"trough": 1.5}, "trough: 1.5 is not allowed; allowed: 0..1"),
        ({"cold_start_seconds": (10.0, 5.0)}, "cold_start_seconds"),
        ({"warmup_seconds": 200.0}, "warmup_seconds: 200.0 is not allowed"),
        (
            {"peer_delay_seconds": -0.001},
            "peer_delay_seconds: -0.001 is not allowed; allowed: >= 0",
        ),
    ],
)
def test_bad_config_names_field_value_and_allowed(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replace(SMALL, **change).validate()  # type: ignore[arg-type]


def test_a_host_tier_raises_the_hit_rate_where_hbm_cannot_hold_the_sessions() -> None:
    """Mooncake sessions on four v6e 1x1 replicas (~108k tokens of HBM KV each): blocks
    evicted from HBM are demoted to the host tier and later turns load them back, so the
    same traffic finds more of its prompts cached, part of them in host memory."""
    base = FleetConfig(generation="v6e", topology="1x1", replicas=4, peak_rate=2.0,
                       trough=1.0, bursts_per_hour=0.0, duration_seconds=120.0,
                       warmup_seconds=30.0)  # fmt: skip
    without = run_fleet(base).summary()
    with_tier = run_fleet(replace(base, host_cache_tokens=2_000_000)).summary()
    assert without["requests"] == with_tier["requests"]
    assert without["host_cache_hit_rate"] == 0.0
    assert with_tier["host_cache_hit_rate"] > 0.02
    assert with_tier["cache_hit_rate"] > without["cache_hit_rate"] + 0.02
    assert with_tier["ttft_p99"] < without["ttft_p99"]
    with pytest.raises(ValueError, match=r"host_cache_tokens: -1 is not allowed; allowed: >= 0"):
        replace(base, host_cache_tokens=-1).validate()


class _WantsOne(FleetSim):
    """Desires every replica at the first decision (t = 15 s), then one (nothing else
    changes)."""

    def desired_replicas(self, current: int) -> int:
        return self.config.replicas if self.now < 20 else 1


def test_scale_down_follows_the_behaviour_and_scales_with_the_fleet() -> None:
    """40 replicas wanting 1: once the 300-s window no longer holds the first desire (40, at
    15 s) the default sheds 10 % a minute, not one slice a minute (the model's old fixed
    step)."""
    config = replace(
        SMALL, replicas=40, initial_replicas=40, autoscale=True, peak_rate=1.0,
        duration_seconds=480.0, bursts_per_hour=0.0,
    )  # fmt: skip
    res = _WantsOne(config).run()
    # decisions at 15, 30, ..., 480; the window holds 40 until 315 s; 330 s: 40 -> 36, 390 s:
    # 36 -> 32 (10 % of the count, rounded down as the HPA does), 450 s: 32 -> 28
    assert res.scale_downs == 12
    one_a_minute = _WantsOne(replace(config, behavior=scaling_behavior.ONE_PER_MINUTE)).run()
    assert one_a_minute.scale_downs == 3


def test_scale_up_follows_the_behaviour() -> None:
    """One replica wanting all: one per minute under the operator's old behaviour, doublings
    per 15 s under the default (the model used to start them all at once)."""

    class _WantsAll(FleetSim):
        def desired_replicas(self, current: int) -> int:
            return self.config.replicas

    config = replace(
        SMALL, replicas=40, initial_replicas=1, autoscale=True, peak_rate=1.0,
        duration_seconds=90.0, bursts_per_hour=0.0, cold_start_seconds=(600.0, 600.0),
    )  # fmt: skip
    slow = _WantsAll(replace(config, behavior=scaling_behavior.ONE_PER_MINUTE)).run()
    assert slow.scale_ups == 2  # at 15 s and 75 s
    fast = _WantsAll(config).run()
    assert fast.scale_ups == 39  # 1 -> 5 -> 10 -> 20 -> 40 at 15, 30, 45 and 60 s
