"""A predictive floor: the fewest replicas to have running one cold start from now. Pure.

A TPU replica takes minutes to serve (tpuserve's cold-start model: ~97 s with a warm compile
cache, ~272 s cold, plus weights), so a reactive autoscaler misses the SLO for that long at
every ramp. The floor looks one cold start ahead (``horizon_seconds``) and asks for the
replicas the demand then will need; the reactive autoscaler (HPA or KEDA) still scales above
it, and never below it.

The forecast of the demand rate at ``now + horizon`` is the larger of two:

- **trend**: a line through the recent rate samples (the last ``window_seconds``), evaluated at
  ``now + horizon``, kept within 0 and ``max_growth`` times the window's mean (a short noisy
  window must not extrapolate to infinity). The line is fitted to the *medians* of the
  window's two halves, not by least squares: each half stands for the point (its samples'
  median time, their median rate), and the line passes through the two. On a linear ramp
  (the daily shape over minutes) both fits give the same line, since the median of a
  monotone linear series is its midpoint's value. They differ on a burst: least squares has
  a breakdown point of zero (one high sample moves the line), and a 60-s burst at 2x in the
  last minute of a 5-minute window, lever-armed one cold start ahead, read as a ramp asking
  for up to 4x the demand (233-250 replicas at 1,000 chips where the demand needed 70-200;
  docs/capacity-planning.md). A median ignores what covers less than half of its
  half-window (at the fleet model's 300-s window, bursts shorter than ~75 s; at the CRD's
  default 600 s, ~150 s), and a burst that short is over long before a replica asked for at
  its start can serve (a cold start is minutes): the floor is for changes that last, and the
  reactive trigger handles the queue a burst leaves. A change that covers more than half of
  the recent half is taken as the new level, and one lasting more than half the window as a
  ramp. This is expressible in PromQL (``quantile_over_time(0.5, ...)`` over the two
  halves), so the operator's trigger is the same rule (`render.autoscaler.floor_trigger`).
  Until 2026-12-07 the trend was the least-squares line (AIBrix's predictive autoscaler's;
  `least_squares_forecast`, kept to compare with);
- **daily shape**: the demand's known shape over the day (``daily_shape``: relative demand
  for each hour, 0:00 to 23:00, as `tpuserve plan` models it), scaled to the level observed
  now (the trend's line at ``now``): ``level x shape(now + horizon) / shape(now)``.

- **recent peak** (optional, ``peak`` from the caller): the highest one-minute rate of the last
  ``peak_window_seconds``, carried along the daily shape like the level. A burst shorter than
  a cold start is over before any replica asked for at its start can serve, and a trend
  fitted to it points the wrong way once it ends; the only capacity that serves recurring
  bursts is capacity held for them. Holding the recent peak does that (Knative's autoscaler
  likewise never scales below what its panic window saw), at the cost of idle chips between
  bursts: off unless asked for.

The larger is taken because the floor exists for ramps: a wrong guess upwards costs idle chips
for one horizon, a wrong guess downwards costs SLO minutes, and the reactive scaler already
handles everything else. The floor is ``ceil(forecast x (1 + headroom) / per_replica_rate)``,
bounded by ``min_replicas`` and ``max_replicas`` (the spec's). With no samples it is
``min_replicas``. Rates are in any one unit (requests/s, prompt tokens/s) as long as
``per_replica_rate`` is in the same one.

The operator renders the same rule in PromQL as a KEDA trigger
(`render.autoscaler.floor_trigger`, `autoscaling.keda.predictiveFloor`), with yesterday's
measured request rate as the daily shape; the fleet model (`tpuserve.bench.autoscaling`) runs
this function with the planner's shape. Where they differ: the trigger's samples are Prometheus'
one-minute rate every 30 s, the model's the arrivals between its 15-s decisions (the median's
quantile is the same interpolation, Prometheus' ``quantile_over_time(0.5)`` and the mean of the
middle two here). `forecast_parts` gives the forecast's parts (trend, daily shape, recent peak)
so a run can show which one set the floor.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

HOURS = 24
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = HOURS * SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class FloorParams:
    """How the floor reads the signal; defaults follow the text above."""

    horizon_seconds: float = 300.0
    """How far ahead to look: one cold start (node, image, weights, compile)."""
    window_seconds: float = 300.0
    """The recent window the samples cover (the trend's two halves are its halves)."""
    per_replica_rate: float = 1.0
    """Demand one replica serves within the SLO, in the samples' unit."""
    max_growth: float = 4.0
    """The trend's forecast is at most this many times the window's mean (AIBrix: 4)."""
    headroom: float = 0.0
    """Extra share of the forecast to provision for (0.1: 10 % more)."""
    daily_shape: tuple[float, ...] | None = None
    """Relative demand of each hour of the day (24 values, 0:00 first); None: no shape."""
    peak_window_seconds: float = 0.0
    """How far back the recent peak reaches (the caller measures it); 0: no peak hold."""

    def __post_init__(self) -> None:
        if not self.horizon_seconds >= 0:
            raise ValueError(f"horizon_seconds: {self.horizon_seconds!r}; allowed: >= 0")
        if not self.window_seconds > 0:
            raise ValueError(f"window_seconds: {self.window_seconds!r}; allowed: > 0")
        if not self.per_replica_rate > 0:
            raise ValueError(f"per_replica_rate: {self.per_replica_rate!r}; allowed: > 0")
        if not self.max_growth >= 1:
            raise ValueError(f"max_growth: {self.max_growth!r}; allowed: >= 1")
        if not self.peak_window_seconds >= 0:
            raise ValueError(f"peak_window_seconds: {self.peak_window_seconds!r}; allowed: >= 0")
        if not self.headroom >= 0:
            raise ValueError(f"headroom: {self.headroom!r}; allowed: >= 0")
        shape = self.daily_shape
        if shape is not None and (len(shape) != HOURS or min(shape) <= 0):
            raise ValueError("daily_shape: allowed: 24 hourly values, each > 0")


def least_squares_forecast(
    samples: Sequence[tuple[float, float]], at: float, max_growth: float
) -> float:
    """The least-squares line through ``samples`` ((seconds, rate)) at time ``at``, within 0
    and ``max_growth`` x the samples' mean rate: the trend until 2026-12-07 (PromQL's
    ``predict_linear``), kept to compare with."""
    n = len(samples)
    mean_rate = sum(r for _, r in samples) / n
    if n == 1:
        return max(0.0, mean_rate)
    mean_t = sum(t for t, _ in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    slope = 0.0 if var == 0 else sum((t - mean_t) * (r - mean_rate) for t, r in samples) / var
    value = mean_rate + slope * (at - mean_t)
    return min(max(0.0, value), max_growth * max(0.0, mean_rate))


def trend_forecast(
    samples: Sequence[tuple[float, float]],
    now: float,
    at: float,
    window_seconds: float,
    max_growth: float,
) -> float:
    """The line through the medians of the window's two halves at time ``at``, within 0 and
    ``max_growth`` x the samples' mean rate (the module's docstring says why medians).

    ``samples`` ((seconds, rate), oldest first) cover ``(now - window_seconds, now]``; the
    recent half is those after ``now - window_seconds / 2``. Each half stands for the point
    (median time, median rate); the line passes through both (flat through the recent one
    while the older half has no samples yet)."""
    cut = now - window_seconds / 2.0
    recent = [(t, r) for t, r in samples if t > cut]
    older = [(t, r) for t, r in samples if t <= cut]
    if not recent:  # nothing in the recent half: the older half, flat
        recent, older = older, []
    t1 = statistics.median(t for t, _ in recent)
    level = statistics.median(r for _, r in recent)
    slope = 0.0
    if older:
        t0 = statistics.median(t for t, _ in older)
        if t1 > t0:
            slope = (level - statistics.median(r for _, r in older)) / (t1 - t0)
    value = level + slope * (at - t1)
    mean_rate = sum(r for _, r in samples) / len(samples)
    return min(max(0.0, value), max_growth * max(0.0, mean_rate))


def shape_at(shape: Sequence[float], seconds_of_day: float) -> float:
    """The hourly shape at a time of day, linear between hour marks, wrapping at midnight."""
    hour = (seconds_of_day % SECONDS_PER_DAY) / SECONDS_PER_HOUR
    i = int(hour) % HOURS
    frac = hour - int(hour)
    return shape[i] * (1.0 - frac) + shape[(i + 1) % HOURS] * frac


def shape_forecast(
    shape: Sequence[float], level: float, seconds_of_day: float, horizon_seconds: float
) -> float:
    """``level`` (the rate now) carried along the daily shape to ``horizon_seconds`` later."""
    now = shape_at(shape, seconds_of_day)
    return level * shape_at(shape, seconds_of_day + horizon_seconds) / now


@dataclass(frozen=True, slots=True)
class ForecastParts:
    """The forecast's parts (rates at ``now + horizon``, in the samples' unit): ``trend``, the
    rate ``shaped`` along the daily shape (0 without one) and the ``held`` recent peak (0 when
    not asked for); ``forecast`` is the largest. A run logs them to show which set the floor."""

    trend: float
    shaped: float
    held: float

    @property
    def forecast(self) -> float:
        return max(self.trend, self.shaped, self.held)

    @property
    def binding(self) -> str:
        """The part that set the forecast (the first of trend, shaped, held on a tie)."""
        f = self.forecast
        return "trend" if self.trend == f else "shaped" if self.shaped == f else "held"


def forecast_parts(
    samples: Sequence[tuple[float, float]],
    now: float,
    seconds_of_day: float,
    params: FloorParams,
    peak: float = 0.0,
) -> ForecastParts:
    """`forecast_rate`'s parts; all 0 without samples."""
    if not samples:
        return ForecastParts(0.0, 0.0, 0.0)
    w, g = params.window_seconds, params.max_growth
    trend = trend_forecast(samples, now, now + params.horizon_seconds, w, g)
    held = peak if params.peak_window_seconds > 0 else 0.0
    shaped = 0.0
    if params.daily_shape is not None:
        level = trend_forecast(samples, now, now, w, g)
        shaped = shape_forecast(params.daily_shape, level, seconds_of_day, params.horizon_seconds)
        held = shape_forecast(params.daily_shape, held, seconds_of_day, params.horizon_seconds)
    return ForecastParts(trend, shaped, held)


def forecast_rate(
    samples: Sequence[tuple[float, float]],
    now: float,
    seconds_of_day: float,
    params: FloorParams,
    peak: float = 0.0,
) -> float:
    """The demand rate expected at ``now + horizon``: max(trend, daily shape, recent peak); 0
    without samples. ``now`` is on the samples' clock, ``seconds_of_day`` the wall clock's time
    of day; ``peak`` the highest one-minute rate of the last ``peak_window_seconds`` (ignored
    when that is 0)."""
    return forecast_parts(samples, now, seconds_of_day, params, peak).forecast


def replicas_for(forecast: float, params: FloorParams, min_replicas: int, max_replicas: int) -> int:
    """``ceil(forecast x (1 + headroom) / per_replica_rate)`` within the bounds."""
    if min_replicas > max_replicas:
        raise ValueError(f"min_replicas {min_replicas} > max_replicas {max_replicas}")
    needed = math.ceil(forecast * (1.0 + params.headroom) / params.per_replica_rate - 1e-9)
    return max(min_replicas, min(max_replicas, needed))


def predictive_floor(
    samples: Sequence[tuple[float, float]],
    now: float,
    seconds_of_day: float,
    params: FloorParams,
    min_replicas: int,
    max_replicas: int,
    peak: float = 0.0,
) -> int:
    """The replicas to keep at least, from ``samples`` ((seconds, demand rate), oldest first,
    the recent window) and the recent ``peak`` at ``now``, bounded by
    ``min_replicas..max_replicas`` (`replicas_for` refuses min > max)."""
    forecast = forecast_rate(samples, now, seconds_of_day, params, peak)
    return replicas_for(forecast, params, min_replicas, max_replicas)
