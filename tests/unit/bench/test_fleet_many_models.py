"""bench/fleet_many_models.py: its gateway holds per model, scales to zero and keeps a flood to
its own model, on a small seeded run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

many = load_bench_script("fleet_many_models", "bench_fleet_many_models")
SMALL = many.Config(models=12, chips=200, hours=0.5, on_minutes=5.0, off_minutes=5.0,
                    flood_at=10.0, flood_minutes=5.0, seed=3)  # fmt: skip


def failed(result: dict[str, object], group: str) -> int:
    f = result["failed"]
    assert isinstance(f, dict)
    return int(f[f"{group}_refused"] + f[f"{group}_timeout"])


def test_every_request_is_served_failed_or_still_in_flight_at_the_end() -> None:
    r = many.run(SMALL)
    for group in ("others", "flooded"):
        assert r["served"][group] + failed(r, group) <= r["requests"][group]
    assert r["served"]["others"] > 0.9 * r["requests"]["others"]


def test_models_wake_from_zero_and_go_back() -> None:
    r = many.run(SMALL)
    assert r["cold_starts"] > 0
    assert min(r["chips_per_minute"]) < max(r["chips_per_minute"])
    lo, hi = many.COLD_START_S["warm"]
    assert lo <= r["cold_start_p50_s"] <= hi


def test_a_hold_smaller_than_a_cold_start_refuses_and_a_larger_one_does_not() -> None:
    cold = replace(SMALL, cache="cold")
    assert failed(many.run(replace(cold, hold_max_requests=16)), "others") > 0
    assert failed(many.run(replace(cold, hold_max_requests=4096)), "others") == 0


def test_a_flood_leaves_the_other_models_requests_as_they_were() -> None:
    calm = many.run(SMALL)
    flood = many.run(replace(SMALL, flood=True, flood_rate=200.0))
    assert flood["requests"]["flooded"] > calm["requests"]["flooded"]
    assert flood["requests"]["others"] == calm["requests"]["others"]
    assert failed(flood, "others") == failed(calm, "others")
    calm_p99 = calm["others_flood_window_ttft_p99_ms"]
    assert flood["others_flood_window_ttft_p99_ms"] <= calm_p99 * 1.1


def test_the_report_has_a_row_a_run() -> None:
    runs = [many.run(SMALL), many.run(replace(SMALL, flood=True))]
    assert len(many.report(runs).splitlines()) == 2 + len(runs)
