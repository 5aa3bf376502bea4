"""The fleet model's autoscalers (tpuserve.bench.autoscaling): each rule's desired count, the
floor's bound, and the per-minute SLO accounting."""

from __future__ import annotations

import pytest

from sglang_tpu.perf_model import get_profile, peak_prefill_tokens_per_second
from tpuserve.bench.autoscaling import (
    SCALERS,
    AutoscaledFleet,
    MinuteStats,
    ScalerConfig,
    hpa_pods_metric_replicas,
    run_autoscaled,
)
from tpuserve.fleet import READY, STARTING, FleetConfig

pytestmark = pytest.mark.unit

SMALL = FleetConfig(
    replicas=6, initial_replicas=2, peak_rate=6.0, workload="lengths", input_median=500,
    output_min=20, output_max=40, duration_seconds=240.0, warmup_seconds=0.0,
    autoscale=True, cold_start_seconds=(30.0, 30.0), drain_seconds=60.0, bursts_per_hour=0,
)  # fmt: skip


def test_a_minute_violates_when_fewer_than_the_objective_are_good() -> None:
    stats = MinuteStats()
    for _ in range(99):
        stats.add(0, True)
    stats.add(0, False)  # 99 % good: not a violation
    stats.add(2, True)
    stats.add(2, False)  # 50 %: a violation; minute 1 had no request: none
    assert stats.violation_minutes(0.99) == 1
    assert stats.requests == [100, 0, 2]


def test_hpa_on_queue_scales_on_mean_waiting_requests_per_replica() -> None:
    sim = AutoscaledFleet(SMALL, ScalerConfig(scaler="hpa_queue", queue_target=8))
    sim.slots.set_state(sim.engines[0], READY)
    sim.slots.set_state(sim.engines[1], READY)
    sim.wait[0], sim.wait[1] = 20, 12  # mean 16 = 2 x target
    assert sim.desired_replicas(2) == 4
    sim.wait[0], sim.wait[1] = 8, 9  # mean 8.5: within the HPA's 10 % tolerance
    assert sim.desired_replicas(2) == 2


# Hand-computed from kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator.go,
# ReplicaCalculator.calcPlainMetricReplicas and groupPods (a Pods metric, AverageValue target):
# (current, ready pods' values, target, missing pods, unready (Pending) pods) -> desired.
K8S_CASES = [
    # no missing or unready pods: ceil(mean / target x ready pods); replica_calculator_test.go's
    # TestReplicaCalcScaleUpCM (3 pods at 20, 10, 30 against 15 -> 4)
    (3, [20.0, 10.0, 30.0], 15.0, 0, 0, 4),
    (2, [8.0, 9.0], 8.0, 0, 0, 2),  # mean 8.5 / 8 = 1.0625: within the 10 % tolerance
    (4, [2.0, 2.0, 2.0, 2.0], 8.0, 0, 0, 1),  # scale down: ceil(0.25 x 4)
    # scale up with 4 starting (missing) pods at 0: 64 / 6 pods / 8 = 1.333 -> ceil(8.0) = 8;
    # the model's old rule said ceil(6 x 32 / 8) = 24
    (6, [32.0, 32.0], 8.0, 4, 0, 8),
    # scale down with 2 missing pods at the target: (2 + 2 + 8 + 8) / 4 / 8 = 0.625 -> 3
    (4, [2.0, 2.0], 8.0, 2, 0, 3),
    # the missing pods at 0 turn a scale-up (9 / 8) into a scale-down (9 / 3 / 8): keep current
    (3, [9.0], 8.0, 2, 0, 3),
    # Pending pods: 0 on a scale-up (32 / 4 / 8 = 1.0: within the tolerance, keep 4) ...
    (4, [16.0, 16.0], 8.0, 0, 2, 4),
    # ... left out on a scale-down: ceil(0.25 x 2 ready pods)
    (4, [2.0, 2.0], 8.0, 0, 2, 1),
    # new ratio 24 / 2 / 8 = 1.5 asks for 3, below current 10 although scaling up: keep current
    (10, [24.0], 8.0, 1, 0, 10),
    (5, [], 8.0, 5, 0, 5),  # no pod has the metric yet: the HPA cannot compute; no change
]


@pytest.mark.parametrize(("current", "ready", "target", "missing", "unready", "want"), K8S_CASES)
def test_the_hpa_rule_is_kubernetes_replica_calculator(
    current: int, ready: list[float], target: float, missing: int, unready: int, want: int
) -> None:
    assert hpa_pods_metric_replicas(current, ready, target, missing, unready) == want


def test_hpa_on_queue_counts_starting_slices_as_missing_pods_not_as_serving_ones() -> None:
    sim = AutoscaledFleet(SMALL, ScalerConfig(scaler="hpa_queue", queue_target=8))
    for i in range(2):
        sim.slots.set_state(sim.engines[i], READY)
    for i in range(2, 6):
        sim.slots.set_state(sim.engines[i], STARTING)
    sim.wait[0], sim.wait[1] = 32, 32
    assert sim.desired_replicas(6) == 8  # (32 + 32) / 8, not 6 x 32 / 8 = 24
    sim.wait[0], sim.wait[1] = 2, 2  # scale-down: the starting slices count at the target
    assert sim.desired_replicas(6) == 5  # (2 + 2 + 4 x 8) / 6 / 8 = 0.75 -> ceil(4.5)


def test_keda_on_backlog_divides_waiting_tokens_by_the_performance_models_throughput() -> None:
    sim = AutoscaledFleet(SMALL, ScalerConfig(scaler="keda_backlog", backlog_target_seconds=1.0))
    tps = peak_prefill_tokens_per_second(SMALL.shape, get_profile(SMALL.model))
    assert sim.prefill_tps == pytest.approx(tps)
    sim.slots.set_state(sim.engines[0], READY)
    sim.wtok[0] = int(2.5 * tps)  # 2.5 s of backlog, 1 s per replica
    assert sim.desired_replicas(1) == 3
    sim.wtok[0] = 0
    assert sim.desired_replicas(1) == 0  # the fleet's bounds then keep min_replicas


def test_the_floor_keeps_replicas_for_the_forecast_rate() -> None:
    scaler = ScalerConfig(scaler="keda_backlog_floor", per_replica_rate=1.0)
    sim = AutoscaledFleet(SMALL, scaler)
    sim.slots.set_state(sim.engines[0], READY)
    sim.now, sim.arrived = 15.0, 45  # 3 requests/s over the first 15 s
    assert sim.desired_replicas(1) >= 3
    assert sim.floor_history[-1][1] >= 3


@pytest.mark.parametrize("scaler", SCALERS)
def test_every_scaler_runs_a_window_and_accounts_chips_and_minutes(scaler: str) -> None:
    result, figures = run_autoscaled(SMALL, ScalerConfig(scaler=scaler, per_replica_rate=3.0))
    assert result.requests > 0
    assert figures["minutes_with_requests"] == 4
    assert 0 < figures["chip_hours"] <= SMALL.replicas * SMALL.shape.chips * 240 / 3600
    assert 0 <= figures["slo_violation_minutes"] <= 4
    if scaler in ("keda_backlog_floor", "keda_backlog_floor_peak"):
        # the floor's parts: which one set it how often, and each one's highest ask
        assert figures["rule"] == "median-trend"
        assert figures["floor_window_seconds"] == 300.0
        assert set(figures["floor_binding_share"]) <= {"trend", "shaped", "held"}
        assert sum(figures["floor_binding_share"].values()) == pytest.approx(1.0, abs=1e-3)
        assert set(figures["floor_parts_max_replicas"]) == {"trend", "shaped", "held"}
        assert 1 <= figures["floor_max_counted"] <= figures["floor_max"]
    if scaler == "hpa_queue":
        assert figures["rule"] == "kubernetes"


def test_the_max_replicas_reference_holds_every_replica_whatever_the_signals() -> None:
    sim = AutoscaledFleet(SMALL, ScalerConfig(scaler="max_replicas"))
    assert sim.desired_replicas(1) == SMALL.replicas  # nothing waits, nothing arrives
    result, _ = run_autoscaled(SMALL, ScalerConfig(scaler="max_replicas"))
    assert result.summary()["replicas_max"] == SMALL.replicas
    assert result.summary()["scale_downs"] == 0


def test_an_unknown_scaler_is_refused() -> None:
    with pytest.raises(ValueError, match="allowed"):
        AutoscaledFleet(SMALL, ScalerConfig(scaler="vpa"))


def test_the_ceiling_report_finds_the_bursty_days_demand_over_the_whole_fleet() -> None:
    """`bench/autoscaling_day.py --ceiling`: the seconds in which the demand (shape x bursts)
    asks for more than the most replicas' planned capacity; the same at 100 and 1,000 chips."""
    from tests.bench_scripts import load_bench_script

    day = load_bench_script("autoscaling_day")

    def rows(replicas: int) -> dict[tuple[str, str], dict[str, object]]:
        args = day.argparse.Namespace(
            days=list(day.DAYS), scalers=["hpa_queue"], replicas=replicas, window=3600.0,
            warmup=900.0, peak_load=0.8, capacity=5.25, ttft=5.0, itl=0.1, seed=0, rows=None,
            hours=None, behavior="default",
        )  # fmt: skip
        return {(r["day"], r["window"]): r for r in day.ceiling(args)}

    small = rows(25)
    assert len(small) == 8
    # 03:00: 0.35 of the peak, 2x bursts reach 0.56 of the fleet: never over it
    assert small[("bursty", "03:00")]["seconds_over_fleet"] == 0
    assert small[("bursty", "03:00")]["peak_demand_over_fleet"] == pytest.approx(0.56, abs=0.02)
    # 15:00: 0.8 x 2 = 1.6x the fleet in every burst second
    peak = small[("bursty", "15:00")]
    assert peak["peak_demand_over_fleet"] == pytest.approx(1.6, abs=0.01)
    over_peak = peak["seconds_over_fleet"]
    assert isinstance(over_peak, int)
    assert over_peak > small[("planner", "15:00")]["seconds_over_fleet"]  # type: ignore[operator]
    assert rows(250) == small  # the demand scales with the fleet


def test_the_peak_holding_floor_keeps_the_highest_minute_of_its_window() -> None:
    sim = AutoscaledFleet(
        SMALL, ScalerConfig(scaler="keda_backlog_floor_peak", floor_peak_window_seconds=120)
    )
    assert sim.floor_params.peak_window_seconds == 120
    # 10 arrivals every 15 s, and 360 at once just before t=75
    arrivals = {t: 10 * (t // 15) + (360 if t >= 75 else 0) for t in range(0, 256, 15)}
    peaks = {}
    for t, n in arrivals.items():
        sim.arrived = n
        peaks[t] = sim._recent_peak(float(t))
    assert peaks[45] == 0.0  # not a whole minute yet
    assert peaks[60] == pytest.approx(40 / 60)
    assert peaks[75] == pytest.approx(400 / 60)  # 360 arrivals in 15 s: the minute's rate
    assert peaks[240] == pytest.approx(400 / 60)  # held: the minute to 120 s has the jump
    assert peaks[255] == pytest.approx(40 / 60)  # 120 s after that, out of the window
    plain = AutoscaledFleet(SMALL, ScalerConfig(scaler="keda_backlog_floor"))
    assert plain.floor_params.peak_window_seconds == 0
    assert plain._recent_peak(60.0) == 0.0


def test_the_split_counts_violations_beyond_the_minutes_over_the_ceiling() -> None:
    """`bench/autoscaling_day.py --split`: per window at most min(v, c) of the v violation
    minutes are in the c minutes over the fleet's ceiling, at least v - c beyond them; each
    window scaled to the day by its weight."""
    from tests.bench_scripts import load_bench_script

    day = load_bench_script("autoscaling_day")
    args = {
        "replicas": 25, "window": 3600.0, "warmup": 900.0, "peak_load": 0.8,
        "capacity": 5.25, "ttft": 5.0, "itl": 0.1, "seed": 0,
    }  # fmt: skip

    def row(scaler: str, hour: float, violations: int) -> dict[str, object]:
        return {"day": "bursty", "scaler": scaler, "start_hour": hour, "weight_hours": 6.0,
                "window_hours": 0.75, "slo_violation_minutes": violations,
                "chip_hours": 10.0, "goodput_share": 1.0, "ttft_p99": 1.0,
                "replicas_min": 1, "replicas_max": 25, "failed": 0}  # fmt: skip

    rows = [row("hpa_queue", 3.0, 10), row("hpa_queue", 15.0, 30),
            row("keda_backlog_floor", 3.0, 0), row("keda_backlog_floor", 15.0, 5)]  # fmt: skip
    data = {"args": args, "rows": rows, "table": day.aggregate(rows)}
    over = {
        c["window"]: c["minutes_over_fleet"]
        for c in day.ceiling(day.argparse.Namespace(
            days=["bursty"], scalers=["hpa_queue"], rows=None, hours=None, behavior="default",
            **args))
        if c["day"] == "bursty"
    }  # fmt: skip
    assert over["03:00"] == 0
    assert over["15:00"] > 5
    split = {r["scaler"]: r for r in day.split(data)}
    hpa, floor = split["hpa_queue"], split["keda_backlog_floor"]
    assert hpa["slo_violation_minutes_per_day"] == 40 * 8
    assert hpa["at_the_ceiling_at_most"] == over["15:00"] * 8
    assert hpa["beyond_the_ceiling_at_least"] == (10 + 30 - over["15:00"]) * 8
    assert floor["at_the_ceiling_at_most"] == 5 * 8  # fewer violations than minutes over it
    assert floor["beyond_the_ceiling_at_least"] == 0
    assert "| -100 % |" in day.split_report(data)
    # two of the four windows: the day says so, and the windows not run are named
    assert "| bursty (12 of 24 h) |" in day.split_report(data)
    assert "| 10 / not run / 30 / not run |" in day.report(data)


def test_rows_of_each_behaviour_are_their_own_and_compare_with_todays_hpa() -> None:
    """`--behavior`: a scaler's rows under two behaviours are two table rows, named by their
    behaviour; the "vs" columns compare with the first HPA row (the operator's old one slice a
    minute); rows that name no behaviour (runs before it existed) keep their old name."""
    from tests.bench_scripts import load_bench_script

    day = load_bench_script("autoscaling_day")

    def row(scaler: str, behavior: str | None, violations: int, chips: float) -> dict[str, object]:
        out: dict[str, object] = {
            "day": "planner", "scaler": scaler, "start_hour": 3.0, "weight_hours": 6.0,
            "window_hours": 0.75, "slo_violation_minutes": violations, "chip_hours": chips,
            "goodput_share": 1.0, "ttft_p99": 1.0, "replicas_min": 1, "replicas_max": 25,
            "failed": 0,
        }  # fmt: skip
        if behavior is not None:
            out["behavior"] = behavior
        return out

    rows = [row("keda_backlog_floor", "default", 5, 8.0), row("hpa_queue", "default", 20, 9.0),
            row("hpa_queue", "one-per-minute", 10, 10.0)]  # fmt: skip
    table = day.aggregate(rows)
    assert [(t["scaler"], t["behavior"]) for t in table] == [
        ("hpa_queue", "one-per-minute"), ("hpa_queue", "default"),
        ("keda_backlog_floor", "default"),
    ]  # fmt: skip
    report = day.report({"rows": rows, "table": table}).splitlines()
    assert "1 slice/min up and down (the operator's behaviour until 2026-12-07)" in report[2]
    assert "| -50 % | 64 | -20 % |" in report[4]  # the floor against today's HPA
    # a row from other windows than the baseline's is no per-day comparison: no "vs"
    nine = {**row("hpa_queue", "one-per-minute", 1, 1.0), "start_hour": 9.0}
    partial = day.aggregate([*rows, nine])
    lines = day.report({"rows": [], "table": partial}).splitlines()
    assert "| planner (12 of 24 h) |" in lines[2]
    assert "| – |" not in lines[2]  # the baseline itself
    assert "| 40 | – | 64 | – |" in lines[4]
    old = day.aggregate([row("hpa_queue", None, 10, 10.0)])
    assert "| HPA on `queue` (today) |" in day.report({"rows": [], "table": old})
