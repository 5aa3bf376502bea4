"""The predictive floor in the server's status (issue 60): the floor now and why, read from the
HorizontalPodAutoscaler KEDA makes for the ScaledObject (`tpuserve_operator.floor_status`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tpuserve_operator.api import TPUModelServerStatus
from tpuserve_operator.floor_status import floor_statuses, keda_hpa_name
from tpuserve_operator.observed import child_view, server_key_of
from tpuserve_operator.render import Rendered

pytestmark = pytest.mark.unit

RenderFn = Callable[..., Rendered]
SpecWith = Callable[..., dict[str, Any]]
FLOOR = {"requestsPerReplica": 5, "horizonSeconds": 480, "windowSeconds": 900}


def floored(spec_with: SpecWith, **autoscaling: Any) -> dict[str, Any]:
    return spec_with(autoscaling={
        "engine": "keda", "minReplicas": 2, "maxReplicas": 8, "metric": "backlogSeconds",
        "target": 1, "keda": {"predictiveFloor": FLOOR}, **autoscaling,
    })  # fmt: skip


def keda_hpa(so: dict[str, Any], current: int, floor: str | None, reactive: str | None) -> Any:
    """The HPA as KEDA v2.20 makes it (the ScaledObject's labels copied over its own, owned by
    the ScaledObject) with the status the HPA controller writes."""
    metrics = [
        {"type": "External", "external": {"metric": {"name": name},
                                          "current": {"averageValue": value}}}
        for name, value in (("s0-prometheus", reactive), ("s1-prometheus", floor))
        if value is not None
    ]  # fmt: skip
    labels = {"app.kubernetes.io/managed-by": "keda-operator", **so["metadata"]["labels"]}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": keda_hpa_name(so["metadata"]["name"]),
            "namespace": so["metadata"]["namespace"],
            "uid": "hpa-uid",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "keda.sh/v1alpha1",
                    "kind": "ScaledObject",
                    "name": so["metadata"]["name"],
                    "uid": "so-uid",
                    "controller": True,
                }
            ],
        },
        "status": {
            "currentReplicas": current,
            "desiredReplicas": current,
            "currentMetrics": metrics,
        },
    }


def statuses(out: Rendered, *hpas: dict[str, Any]) -> list[Any]:
    views = {(v.kind, v.name): v for v in map(child_view, hpas)}
    return floor_statuses(out, views)


def scaled_object(out: Rendered) -> dict[str, Any]:
    (so,) = [c for c in out.children if c["kind"] == "ScaledObject"]
    return so


def test_the_floor_decides_when_the_forecast_needs_more_than_the_backlog(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    out = rendered(floored(spec_with), keda=True)
    so = scaled_object(out)
    # 4 replicas now; the floor's metric 7.5 req/s each = 30 req/s forecast -> 6 replicas
    # at 5 req/s per replica; the backlog 0.5 s each = 2 s at 1 s per replica -> 2
    hpa = keda_hpa(so, 4, floor="7500m", reactive="500m")
    assert server_key_of(hpa) == ("ml", "qwen")  # the operator's watch sees KEDA's HPA
    assert child_view(hpa).owner_uid == "so-uid"  # owned by the ScaledObject: never pruned
    (st,) = statuses(out, hpa)
    assert (st.scaled_object, st.role, st.horizon_seconds) == ("qwen", "", 480)
    assert (st.replicas, st.reactive_replicas, st.current_replicas) == (6, 2, 4)
    assert st.forecast_requests_per_second == pytest.approx(30.0)
    assert st.reason == "FloorDecides"
    assert "30 requests/s forecast 480 s ahead / 5 per replica = 6, within 2..8" in st.message
    assert "backlog-seconds asks 2" in st.message
    written = TPUModelServerStatus(predictive_floor=[st]).model_dump(
        by_alias=True, exclude_unset=True
    )
    assert written["predictiveFloor"][0]["reason"] == "FloorDecides"
    assert written["predictiveFloor"][0]["forecastRequestsPerSecond"] == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("current", "floor", "reactive", "replicas", "asks", "reason"),
    [
        (4, "2", "2", 2, 8, "ReactiveDecides"),  # 8 req/s -> 2 (the min); backlog 8 s -> 8
        (4, "3", "1250m", 3, 5, "ReactiveDecides"),  # 12 req/s -> 3; backlog 5 s -> 5
        (2, "1", "500m", 2, 1, "AtMinReplicas"),  # 2 req/s -> 1, held at the min of 2
        (8, "10", "500m", 8, 4, "AtMaxReplicas"),  # 80 req/s -> 16, held at the max of 8
        (8, "1", "2", 2, 16, "AtMaxReplicas"),  # the backlog asks 16 of at most 8
    ],
)
def test_the_reason_names_what_holds_the_count(
    rendered: RenderFn, spec_with: SpecWith, current: int, floor: str, reactive: str,
    replicas: int, asks: int, reason: str,
) -> None:  # fmt: skip
    out = rendered(floored(spec_with), keda=True)
    (st,) = statuses(out, keda_hpa(scaled_object(out), current, floor, reactive))
    assert (st.replicas, st.reactive_replicas, st.reason) == (replicas, asks, reason)


def test_not_measured_until_keda_reports_the_floors_metric(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    out = rendered(floored(spec_with), keda=True)
    (st,) = statuses(out)
    assert (st.reason, st.replicas) == ("NotMeasured", None)
    assert "no HPA from KEDA yet" in st.message
    (st,) = statuses(out, keda_hpa(scaled_object(out), 3, floor=None, reactive="1"))
    assert (st.reason, st.replicas, st.current_replicas) == ("NotMeasured", None, 3)
    assert "HPA keda-hpa-qwen has not reported it" in st.message


def test_no_floor_no_status(rendered: RenderFn, spec_with: SpecWith) -> None:
    plain = spec_with(autoscaling={"engine": "keda", "minReplicas": 1, "maxReplicas": 8})
    assert statuses(rendered(plain, keda=True)) == []
    hpa = spec_with(autoscaling={"minReplicas": 1, "maxReplicas": 8})
    assert statuses(rendered(hpa)) == []
