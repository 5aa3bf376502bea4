"""The predictive floor: replicas for one cold start ahead from the trend and the daily shape,
bounded by the spec's min and max."""

from __future__ import annotations

import pytest

from tpuserve_operator.predictive_floor import (
    FloorParams,
    forecast_parts,
    forecast_rate,
    least_squares_forecast,
    predictive_floor,
    shape_at,
    trend_forecast,
)

pytestmark = pytest.mark.unit

RAMP = [(float(t), 10.0 + 0.1 * t) for t in range(0, 301, 30)]  # +0.1 req/s every second
FLAT = [(float(t), 20.0) for t in range(0, 301, 30)]


def test_a_rising_trend_is_extrapolated_one_horizon_ahead() -> None:
    # at t=300 the rate is 40; 300 s later the line says 70 (medians of the halves and least
    # squares agree on a linear ramp)
    assert trend_forecast(RAMP, 300.0, 600.0, 300.0, max_growth=4.0) == pytest.approx(70.0)
    assert least_squares_forecast(RAMP, 600.0, max_growth=4.0) == pytest.approx(70.0)
    params = FloorParams(horizon_seconds=300, per_replica_rate=10)
    assert predictive_floor(RAMP, 300.0, 0.0, params, 1, 100) == 7


def test_a_flat_rate_asks_for_what_it_needs_now() -> None:
    params = FloorParams(horizon_seconds=300, per_replica_rate=10)
    assert predictive_floor(FLAT, 300.0, 0.0, params, 1, 100) == 2


def test_a_falling_trend_never_goes_below_zero_nor_the_minimum() -> None:
    falling = [(t, max(0.0, 30.0 - r)) for t, r in RAMP]
    assert trend_forecast(falling, 300.0, 10_000.0, 300.0, max_growth=4.0) == 0.0
    params = FloorParams(horizon_seconds=300, per_replica_rate=10)
    assert predictive_floor(falling, 300.0, 0.0, params, 3, 100) == 3


def test_the_trend_is_clamped_to_a_multiple_of_the_windows_mean() -> None:
    steep = [(0.0, 1.0), (10.0, 100.0)]
    mean = 50.5
    assert trend_forecast(steep, 10.0, 1000.0, 20.0, max_growth=4.0) == pytest.approx(4 * mean)


def test_the_maximum_bounds_the_floor() -> None:
    params = FloorParams(horizon_seconds=300, per_replica_rate=1)
    assert predictive_floor(RAMP, 300.0, 0.0, params, 1, 16) == 16


def test_no_samples_keeps_the_minimum() -> None:
    params = FloorParams(per_replica_rate=5, daily_shape=(1.0,) * 24)
    assert predictive_floor([], 0.0, 0.0, params, 2, 10) == 2


def test_the_daily_shape_anticipates_the_morning_ramp_a_flat_window_cannot_see() -> None:
    # demand doubles between 08:00 and 09:00; at 08:00 the window is flat at 20 req/s
    shape = tuple(1.0 if h < 9 else 2.0 for h in range(24))
    at_eight = 8 * 3600.0
    assert shape_at(shape, at_eight + 1800) == pytest.approx(1.5)  # linear between hour marks
    params = FloorParams(horizon_seconds=3600, per_replica_rate=10, daily_shape=shape)
    assert forecast_rate(FLAT, 300.0, at_eight, params) == pytest.approx(40.0)
    assert predictive_floor(FLAT, 300.0, at_eight, params, 1, 100) == 4
    no_shape = FloorParams(horizon_seconds=3600, per_replica_rate=10)
    assert predictive_floor(FLAT, 300.0, at_eight, no_shape, 1, 100) == 2


def test_the_shape_never_lowers_a_rising_trend() -> None:
    falling_shape = tuple(2.0 if h < 9 else 1.0 for h in range(24))
    params = FloorParams(horizon_seconds=300, per_replica_rate=10, daily_shape=falling_shape)
    assert predictive_floor(RAMP, 300.0, 8.99 * 3600, params, 1, 100) == 7


def test_headroom_adds_to_the_forecast() -> None:
    params = FloorParams(horizon_seconds=0, per_replica_rate=10, headroom=0.5)
    assert predictive_floor(FLAT, 300.0, 0.0, params, 1, 100) == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"per_replica_rate": 0},
        {"horizon_seconds": -1},
        {"max_growth": 0.5},
        {"daily_shape": (1.0,) * 23},
        {"daily_shape": (0.0,) * 24},
    ],
)
def test_bad_parameters_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="allowed"):
        FloorParams(**bad)  # type: ignore[arg-type]


def test_min_above_max_is_refused() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        predictive_floor(FLAT, 0.0, 0.0, FloorParams(), 5, 4)


def test_the_recent_peak_is_held_only_when_asked_for_and_follows_the_shape() -> None:
    # a flat 20 req/s now, 50 req/s in a burst earlier in the hour
    off = FloorParams(horizon_seconds=300, per_replica_rate=10)
    assert predictive_floor(FLAT, 300.0, 0.0, off, 1, 100, peak=50.0) == 2  # not asked: ignored
    held = FloorParams(horizon_seconds=300, per_replica_rate=10, peak_window_seconds=3600)
    assert predictive_floor(FLAT, 300.0, 0.0, held, 1, 100, peak=50.0) == 5
    assert predictive_floor(FLAT, 300.0, 0.0, held, 1, 4, peak=50.0) == 4  # within the max
    assert predictive_floor(FLAT, 300.0, 0.0, held, 1, 100, peak=10.0) == 2  # below the trend
    # along the daily shape: 2 at 12:00, falling linearly to 1 at 13:00, so 2 - 1/12 at 12:05
    shape = tuple([1.0] * 12 + [2.0, 1.0] + [1.0] * 10)
    shaped = FloorParams(horizon_seconds=300, per_replica_rate=10, peak_window_seconds=3600,
                         daily_shape=shape)  # fmt: skip
    noon = 12 * 3600.0
    assert forecast_rate(FLAT, 300.0, noon, shaped, peak=80.0) == pytest.approx(
        80.0 * (2 - 1 / 12) / 2
    )
    with pytest.raises(ValueError, match="peak_window_seconds: -1; allowed: >= 0"):
        FloorParams(peak_window_seconds=-1)


# 15-s rate samples of a 300-s window ending at t=300: 10 req/s, then 20 req/s for the last
# 60 s (a 60-s burst at 2x, the planner's day's bursts)
BURST_AT_THE_END = [(float(t), 20.0 if t > 240 else 10.0) for t in range(15, 301, 15)]


def test_a_one_minute_burst_is_not_read_as_a_ramp() -> None:
    # least squares lever-arms the burst 495 s ahead to 3.2x the rate; the halves' medians
    # (4 of the recent half's 10 samples are in the burst) see the flat 10 req/s
    assert least_squares_forecast(BURST_AT_THE_END, 795.0, 4.0) == pytest.approx(32.451, abs=1e-3)
    assert trend_forecast(BURST_AT_THE_END, 300.0, 795.0, 300.0, 4.0) == pytest.approx(10.0)
    params = FloorParams(horizon_seconds=495, window_seconds=300, per_replica_rate=5)
    assert predictive_floor(BURST_AT_THE_END, 300.0, 0.0, params, 1, 100) == 2


def test_a_change_over_most_of_the_recent_half_is_the_new_level() -> None:
    # the last 105 s (7 of the recent half's 10 samples, t = 165..300) at 20 req/s: the recent
    # median is 20 at median time 232.5 s, the older one 10 at 82.5 s; 150 s after 232.5 s
    # the line says 30
    step = [(float(t), 20.0 if t > 195 else 10.0) for t in range(15, 301, 15)]
    assert trend_forecast(step, 300.0, 382.5, 300.0, 4.0) == pytest.approx(30.0)


def test_without_the_older_half_the_trend_is_flat_at_the_recent_median() -> None:
    young = [(240.0, 10.0), (255.0, 12.0), (270.0, 30.0), (285.0, 11.0), (300.0, 13.0)]
    assert trend_forecast(young, 300.0, 900.0, 300.0, 4.0) == pytest.approx(12.0)


def test_the_parts_show_which_one_set_the_forecast() -> None:
    shape = tuple(1.0 if h < 9 else 2.0 for h in range(24))
    params = FloorParams(horizon_seconds=3600, per_replica_rate=10, daily_shape=shape,
                         peak_window_seconds=3600)  # fmt: skip
    parts = forecast_parts(FLAT, 300.0, 8 * 3600.0, params, peak=30.0)
    assert (parts.trend, parts.shaped, parts.held) == pytest.approx((20.0, 40.0, 60.0))
    assert parts.forecast == pytest.approx(60.0)
    assert parts.binding == "held"
    assert forecast_parts(FLAT, 300.0, 0.0, FloorParams()).binding == "trend"
    assert forecast_parts([], 0.0, 0.0, params).forecast == 0.0
