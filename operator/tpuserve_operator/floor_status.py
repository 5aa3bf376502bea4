"""The predictive floor in the server's status: the floor now and why. Pure.

KEDA turns each ScaledObject into a HorizontalPodAutoscaler named ``keda-hpa-<ScaledObject>``,
one External metric per trigger (``s<index>-prometheus``), and the HPA's controller reports
each metric's current value in ``status.currentMetrics``. KEDA copies the ScaledObject's labels
onto that HPA, so the operator's watch of its children sees it (it is owned by the
ScaledObject, never pruned by the operator). From it, for each ScaledObject with
``autoscaling.keda.predictiveFloor``:

- the floor's trigger (the second, ``s1-prometheus``, an AverageValue metric): the HPA reports
  the forecast request rate divided by its current replicas, so the forecast is that times
  ``currentReplicas`` and the floor ``ceil(forecast / requestsPerReplica)`` within the
  ScaledObject's bounds — the rule of `tpuserve_operator.predictive_floor`;
- the reactive trigger (the first, ``s0-prometheus``): the replicas it alone asks for
  (AverageValue: ``ceil(value x current / threshold)``; Value: ``ceil(current x value /
  threshold)``);
- the reason: ``FloorDecides`` when the floor is above the reactive count (KEDA's HPA takes
  the larger), ``ReactiveDecides`` otherwise, ``AtMinReplicas`` / ``AtMaxReplicas`` when a
  bound holds the count, ``NotMeasured`` before the HPA reports the floor's metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tpuserve_operator.api import FloorReason, PredictiveFloorStatus
from tpuserve_operator.observed import ChildView
from tpuserve_operator.render import Rendered
from tpuserve_operator.render.autoscaler import FlooredScaledObject, floored_scaled_objects

HPA_KIND = "HorizontalPodAutoscaler"
REACTIVE_METRIC = "s0-prometheus"
FLOOR_METRIC = "s1-prometheus"
EPSILON = 1e-9


def keda_hpa_name(scaled_object: str) -> str:
    """The HPA KEDA makes for a ScaledObject (no `horizontalPodAutoscalerConfig.name` set)."""
    return f"keda-hpa-{scaled_object}"


def _ceil(value: float) -> int:
    return max(0, math.ceil(value - EPSILON))


def floor_status(so: FlooredScaledObject, hpa: ChildView | None) -> PredictiveFloorStatus:
    """One ScaledObject's floor from its KEDA HPA's view (None: KEDA made none yet)."""
    lo, hi = so.spec.min_replicas, so.spec.max_replicas
    base = PredictiveFloorStatus(
        scaled_object=so.name,
        role=so.role or "",
        requests_per_replica=so.floor.requests_per_replica,
        horizon_seconds=so.floor.horizon_seconds,
        reason="NotMeasured",
    )
    metrics = dict(hpa.external_metrics) if hpa is not None else {}
    current = hpa.current_replicas if hpa is not None else None
    if FLOOR_METRIC not in metrics or current is None:
        where = "no HPA from KEDA yet" if hpa is None else f"HPA {hpa.name} has not reported it"
        message = f"the floor's trigger ({FLOOR_METRIC}) is not measured: {where}"
        return base.model_copy(update={"current_replicas": current, "message": message})
    forecast = metrics[FLOOR_METRIC] * current
    raw = _ceil(forecast / so.floor.requests_per_replica)
    floor = min(hi, max(lo, raw))
    reactive: int | None = None
    if REACTIVE_METRIC in metrics:
        value, threshold = metrics[REACTIVE_METRIC], so.reactive.threshold
        if so.reactive.metric_type == "AverageValue":
            reactive = _ceil(value * current / threshold)
        else:
            reactive = _ceil(current * value / threshold)
    asked = reactive or 0
    reason: FloorReason
    if asked > hi or (floor >= asked and raw > hi):
        reason = "AtMaxReplicas"
    elif max(raw, asked) <= lo:
        reason = "AtMinReplicas"  # neither asks for more than the minimum
    elif floor > asked:
        reason = "FloorDecides"
    else:
        reason = "ReactiveDecides"
    why = (
        f"floor {floor}: {forecast:.4g} requests/s forecast {so.floor.horizon_seconds} s ahead "
        f"/ {so.floor.requests_per_replica:g} per replica = {raw}, within {lo}..{hi}; "
        + (
            f"{so.reactive.name} asks {reactive}"
            if reactive is not None
            else f"{so.reactive.name} not measured yet"
        )
    )
    return base.model_copy(
        update={
            "replicas": floor,
            "forecast_requests_per_second": round(forecast, 6),
            "reactive_replicas": reactive,
            "current_replicas": current,
            "reason": reason,
            "message": why,
        }
    )


def floor_statuses(
    rendered: Rendered, children: Mapping[tuple[str, str], ChildView]
) -> list[PredictiveFloorStatus]:
    """Each floored ScaledObject's status (empty when the server has no predictive floor)."""
    return [
        floor_status(so, children.get((HPA_KIND, keda_hpa_name(so.name))))
        for so in floored_scaled_objects(rendered.server)
    ]
