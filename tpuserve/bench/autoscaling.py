"""Autoscalers on the fleet model: today's HPA on `queue`, KEDA on backlog seconds, and backlog
seconds with the predictive floor (issue 60).

`tpuserve.fleet.FleetSim` runs the fleet (engines, routers, traffic, cold starts, the
HPA's mechanics: a decision every ``hpa_interval_seconds``, then ``FleetConfig.behavior``'s
stabilization windows and rate policies, `tpuserve_operator.scaling_behavior`, slices removed
drained first).
`AutoscaledFleet` only replaces the rule that turns signals into a desired count
(`FleetSim.desired_replicas`) and counts each request's outcome by the minute it arrived in
(`FleetSim.record_outcome`):

- ``hpa_queue``: the operator's HPA with ``metric: queue``: the Pods metric
  ``sglang:num_queue_reqs`` of each replica's leader pod (the scale selector; Prometheus
  Adapter serves it, `tpuserve_operator.build.metrics_adapter`) against ``queue_target`` (the
  CRD's default target, 8), by Kubernetes' own rule for a Pods metric, `hpa_pods_metric_replicas`
  (its docstring cites the source): a serving replica reports its waiting requests; a starting
  one has no metric yet (the engine serves ``/metrics`` once it is up), so it is a *missing*
  pod: 0 when scaling up, the target when scaling down; a slice being deleted (draining, or
  noticed for preemption: its pod is terminating) is left out. Scaling up with starting slices
  this comes to ``ceil(total waiting / target)``. Until 2026-12-07 the model's rule was
  ``ceil(current x mean / target)``, the mean over the serving replicas but ``current``
  counting the starting ones too, which compounded while slices started (not Kubernetes'
  rule);
- ``keda_backlog``: KEDA's ScaledObject with ``metric: backlogSeconds``: the uncached prompt
  tokens waiting or prefilling on every serving replica (the model knows them exactly; the
  chart's rule estimates them from waiting requests), divided by one replica's peak prefill
  throughput (`sglang_tpu.perf_model.peak_prefill_tokens_per_second`, the figure the operator
  renders into the trigger), as KEDA's AverageValue target: ``desired = ceil(backlog seconds /
  target)``;
- ``keda_backlog_floor``: the same, never below `tpuserve_operator.predictive_floor`'s floor:
  arrival rate samples every decision over the last ``floor_window_seconds``, the daily shape
  the traffic follows (the planner's cosine, `fleet.daily_multiplier`), one cold start ahead
  (``cold_start_seconds``' upper bound + one decision interval), against ``per_replica_rate``
  (requests/s one replica serves within the SLO: `tpuserve plan`'s capacity).

- ``keda_backlog_floor_peak``: the same floor holding the recent peak too: the highest
  one-minute arrival rate of the last ``floor_peak_window_seconds`` (an hour), carried along
  the daily shape (`FloorParams.peak_window_seconds`).

- ``max_replicas``: no autoscaler, every replica the spec allows all the time: the most
  capacity any scaler can hold, so a reference for the violation minutes no autoscaler avoids
  on this trace (a reference, not a candidate: it pays for the peak all day).

A minute violates the SLO when fewer than ``slo_objective`` (99 %) of the requests that
arrived in it finished within the TTFT and ITL thresholds (failed requests count as missed).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_tpu.perf_model import get_profile, peak_prefill_tokens_per_second
from tpuserve.fleet import READY, STARTING, FleetConfig, FleetResult, FleetSim, daily_multiplier
from tpuserve_operator.predictive_floor import (
    HOURS,
    FloorParams,
    forecast_parts,
    replicas_for,
)

SCALERS = (
    "hpa_queue", "keda_backlog", "keda_backlog_floor", "keda_backlog_floor_peak", "max_replicas",
)  # fmt: skip
FLOORED = ("keda_backlog_floor", "keda_backlog_floor_peak")
RATE_MINUTE = 60.0
HPA_TOLERANCE = 0.1
MILLI = 1000


def hpa_pods_metric_replicas(
    current: int,
    ready: Sequence[float],
    target: float,
    missing: int = 0,
    unready: int = 0,
    tolerance: float = HPA_TOLERANCE,
) -> int:
    """Kubernetes' HorizontalPodAutoscaler's desired replicas for a Pods metric (type: Pods,
    AverageValue ``target``): ``ReplicaCalculator.GetMetricReplicas`` ->
    ``calcPlainMetricReplicas`` in kubernetes/kubernetes
    pkg/controller/podautoscaler/replica_calculator.go (read at commit 00067268967e; the
    newer releases' form adds the last direction check below, kept here).

    The pods come grouped by ``groupPods``: deleted (terminating) and failed pods are left
    out; ``Pending`` pods are *unready* (``unready`` here); running pods with no sample of the
    metric are *missing* (``missing``); the rest are ready, their values ``ready``. (A
    running but not-Ready pod that has a sample counts as ready for a Pods metric: the
    readiness test is for the CPU resource metric only.) Then:

    - no ready values: the HPA cannot compute and keeps ``current``;
    - ``ratio`` = mean of the ready values / ``target`` (in milli-units, integer mean, as
      ``GetMetricUsageRatio``);
    - no missing pods, and no unready ones or ``ratio`` <= 1: ``current`` within the
      tolerance, else ``ceil(ratio x ready pods)``;
    - otherwise missing pods count as ``target`` when ``ratio`` < 1 (scale-down) and 0
      otherwise, unready ones as 0 when ``ratio`` > 1, and the ratio is recomputed over all
      of them: ``current`` if within the tolerance or if it changed the direction, else
      ``ceil(new ratio x pods counted)``, unless that moves against the new ratio's direction
      (then ``current``).
    """
    if not ready:
        return current
    target_m = round(target * MILLI)
    values = [round(v * MILLI) for v in ready]

    def ratio_of(vals: list[int]) -> float:
        return (sum(vals) // len(vals)) / target_m

    ratio = ratio_of(values)
    rebalance_unready = unready > 0 and ratio > 1.0
    if not rebalance_unready and missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * len(values))
    if missing:
        values += [target_m if ratio < 1.0 else 0] * missing
    if rebalance_unready:
        values += [0] * unready
    new_ratio = ratio_of(values)
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current
    new = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and new > current) or (new_ratio > 1.0 and new < current):
        return current
    return new


@dataclass(frozen=True)
class ScalerConfig:
    scaler: str = "hpa_queue"
    queue_target: float = 8.0
    """Waiting requests per replica (`AutoscalingSpec.target`'s default)."""
    backlog_target_seconds: float = 1.0
    """Seconds of prefill backlog per replica: half the 2-s TTFT SLO."""
    prefill_tokens_per_second: float | None = None
    """None: the performance model's figure for the fleet's model and slice."""
    per_replica_rate: float = 5.25
    """Requests/s one replica serves within the SLO (`tpuserve plan`, v6e 2x2, this workload)."""
    floor_window_seconds: float = 300.0
    floor_headroom: float = 0.0
    floor_peak_window_seconds: float = 3600.0
    """``keda_backlog_floor_peak``'s look back for the recent peak."""
    slo_objective: float = 0.99

    def validate(self) -> None:
        if self.scaler not in SCALERS:
            raise ValueError(f"scaler: {self.scaler!r} is not allowed; allowed: {SCALERS}")


@dataclass
class MinuteStats:
    requests: list[int] = field(default_factory=list)
    missed: list[int] = field(default_factory=list)

    def add(self, minute: int, good: bool) -> None:
        if minute >= len(self.requests):
            grow = minute + 1 - len(self.requests)
            self.requests.extend([0] * grow)
            self.missed.extend([0] * grow)
        self.requests[minute] += 1
        if not good:
            self.missed[minute] += 1

    def violation_minutes(self, objective: float) -> int:
        return sum(
            1
            for n, m in zip(self.requests, self.missed, strict=True)
            if n and (n - m) < objective * n
        )


class AutoscaledFleet(FleetSim):
    def __init__(self, config: FleetConfig, scaler: ScalerConfig) -> None:
        scaler.validate()
        super().__init__(config)
        self.scaler = scaler
        profile = config.profile or get_profile(config.model, "model")
        self.prefill_tps = scaler.prefill_tokens_per_second or peak_prefill_tokens_per_second(
            config.shape, profile, config.quantization
        )
        shape = tuple(daily_multiplier(float(h), config.trough) for h in range(HOURS))
        horizon = config.cold_start_seconds[1] + config.hpa_interval_seconds
        self.floor_params = FloorParams(
            horizon_seconds=horizon,
            window_seconds=scaler.floor_window_seconds,
            per_replica_rate=scaler.per_replica_rate,
            headroom=scaler.floor_headroom,
            daily_shape=shape,
            peak_window_seconds=(
                scaler.floor_peak_window_seconds if scaler.scaler == "keda_backlog_floor_peak"
                else 0.0
            ),
        )  # fmt: skip
        self.minutes = MinuteStats()
        self.rate_samples: deque[tuple[float, float]] = deque()
        self.last_arrived = 0
        self.last_sample_at = 0.0
        self.floor_history: list[tuple[float, int]] = []
        self.floor_binding: Counter[str] = Counter()
        """Decisions by the forecast's part that set the floor (trend, shaped, held)."""
        self.floor_parts_max: dict[str, float] = {"trend": 0.0, "shaped": 0.0, "held": 0.0}
        """Each part's highest forecast after the warmup, in replicas (before the bounds)."""
        self.floor_counted_max = 0
        """The highest floor after the warmup (``floor_max`` counts the warmup too, when the
        arrivals of a session-based workload still ramp up from none)."""
        self.arrival_log: deque[tuple[float, int]] = deque()  # (time, arrivals so far)
        self.minute_rates: deque[tuple[float, float]] = deque()  # (time, last minute's rate)

    def record_outcome(self, arrival: float, good: bool) -> None:
        self.minutes.add(int((arrival - self.config.warmup_seconds) // 60), good)

    def desired_replicas(self, current: int) -> int:
        s = self.scaler
        if s.scaler == "max_replicas":
            return self.config.replicas
        serving = [e for e in self.engines if e.state == READY]
        if s.scaler == "hpa_queue":
            # serving: ready pods with a sample; starting: running, no metric yet (missing);
            # draining and noticed slices' pods are terminating (left out)
            starting = sum(1 for e in self.engines if e.state == STARTING)
            waiting = [float(self.wait[e.i]) for e in serving]
            return hpa_pods_metric_replicas(current, waiting, s.queue_target, missing=starting)
        backlog_seconds = sum(self.wtok[e.i] for e in serving) / self.prefill_tps
        desired = math.ceil(backlog_seconds / s.backlog_target_seconds - 1e-9)
        if s.scaler in FLOORED:
            desired = max(desired, self._floor())
        return desired

    def _floor(self) -> int:
        now = self.now
        arrived = self.arrived - self.last_arrived
        elapsed = now - self.last_sample_at
        self.last_arrived, self.last_sample_at = self.arrived, now
        if elapsed > 0:
            self.rate_samples.append((now, arrived / elapsed))
        while (
            self.rate_samples and self.rate_samples[0][0] < now - self.scaler.floor_window_seconds
        ):
            self.rate_samples.popleft()
        c = self.config
        seconds_of_day = (c.start_hour * 3600.0 + now) % 86_400.0
        params = self.floor_params
        parts = forecast_parts(
            list(self.rate_samples), now, seconds_of_day, params, self._recent_peak(now)
        )
        floor = replicas_for(parts.forecast, params, max(1, c.min_replicas), c.replicas)
        self.floor_history.append((now, floor))
        if now < c.warmup_seconds or not self.rate_samples:
            return floor  # the parts are counted like the minutes: after the warmup
        self.floor_binding[parts.binding] += 1
        self.floor_counted_max = max(self.floor_counted_max, floor)
        for name in self.floor_parts_max:
            replicas = getattr(parts, name) * (1.0 + params.headroom) / params.per_replica_rate
            self.floor_parts_max[name] = max(self.floor_parts_max[name], replicas)
        return floor

    def _recent_peak(self, now: float) -> float:
        """The highest one-minute arrival rate of the last ``floor_peak_window_seconds`` (0 for
        the other scalers): each decision adds the rate over the minute before it."""
        if self.floor_params.peak_window_seconds <= 0:
            return 0.0
        log = self.arrival_log
        log.append((now, self.arrived))
        while len(log) > 1 and log[1][0] <= now - RATE_MINUTE:
            log.popleft()
        then, count = log[0]
        if now - then >= RATE_MINUTE:
            self.minute_rates.append((now, (self.arrived - count) / (now - then)))
        rates = self.minute_rates
        while rates and rates[0][0] < now - self.floor_params.peak_window_seconds:
            rates.popleft()
        return max((r for _, r in rates), default=0.0)


def run_autoscaled(config: FleetConfig, scaler: ScalerConfig) -> tuple[FleetResult, dict[str, Any]]:
    """Run one day (or window); the fleet's summary plus the autoscaling figures."""
    sim = AutoscaledFleet(config, scaler)
    result = sim.run()
    window = result.window_seconds
    chip_hours = result.chip_seconds / 3600.0
    violations = sim.minutes.violation_minutes(scaler.slo_objective)
    figures = {
        "scaler": scaler.scaler,
        "window_hours": window / 3600.0,
        "chip_hours": chip_hours,
        "chip_hours_per_day": chip_hours * 86_400.0 / window,
        "slo_violation_minutes": violations,
        "slo_violation_minutes_per_day": violations * 86_400.0 / window,
        "slo_violation_minutes_per_chip_hour": violations / chip_hours if chip_hours else None,
        "minutes_with_requests": sum(1 for n in sim.minutes.requests if n),
        "prefill_tokens_per_second": sim.prefill_tps,
        "floor_max": max((f for _, f in sim.floor_history), default=None),
    }
    if scaler.scaler == "hpa_queue":
        figures["rule"] = "kubernetes"
    if scaler.scaler in FLOORED:
        figures["rule"] = "median-trend"
        figures["floor_window_seconds"] = scaler.floor_window_seconds
        decisions = sum(sim.floor_binding.values())
        figures["floor_max_counted"] = sim.floor_counted_max
        figures["floor_binding_share"] = {
            k: round(v / max(1, decisions), 4) for k, v in sorted(sim.floor_binding.items())
        }
        figures["floor_parts_max_replicas"] = {
            k: round(v, 2) for k, v in sim.floor_parts_max.items()
        }
    return result, figures
