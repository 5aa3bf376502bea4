"""Render: the HorizontalPodAutoscaler behind `spec.autoscaling`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest

from tpuserve.observability import rules
from tpuserve_operator import labels, scaling_behavior
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import Rendered
from tpuserve_operator.render.autoscaler import ROLE_TTFT_METRIC, TTFT_METRIC, quantity

pytestmark = pytest.mark.unit

RenderFn = Callable[..., Rendered]
SpecWith = Callable[..., dict[str, Any]]


def hpa_of(rendered: Rendered) -> dict[str, Any]:
    (hpa,) = [c for c in rendered.children if c["kind"] == "HorizontalPodAutoscaler"]
    return hpa


def test_no_autoscaling_no_autoscaler(rendered: RenderFn) -> None:
    assert not [c for c in rendered().children if c["kind"] == "HorizontalPodAutoscaler"]


def test_the_autoscaler_targets_the_servers_scale_subresource(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(autoscaling={"minReplicas": 2, "maxReplicas": 6})
    hpa = hpa_of(rendered(spec))
    assert hpa["metadata"]["name"] == "qwen"
    assert hpa["metadata"]["namespace"] == "ml"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "name": "qwen",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    # the behaviour scales with the fleet: up max(4 slices, 100 %) per 15 s, down after 5
    # minutes of lower demand max(1 slice, 10 %) per minute
    assert hpa["spec"]["behavior"] == {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": 4, "periodSeconds": 15},
                {"type": "Percent", "value": 100, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": 1, "periodSeconds": 60},
                {"type": "Percent", "value": 10, "periodSeconds": 60},
            ],
        },
    }
    assert hpa["spec"]["behavior"] == scaling_behavior.DEFAULT.manifest()
    kubernetes_validate.validate(hpa, "1.33.0", strict=True)


def test_the_behaviour_renders_the_specs_policies_and_leaves_a_zero_one_out(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(autoscaling={
        "maxReplicas": 64, "scaleUpPods": 0, "scaleUpPercent": 50, "scaleDownPods": 2,
        "scaleDownPercent": 0, "scaleDownStabilizationSeconds": 600,
    })  # fmt: skip
    hpa = hpa_of(rendered(spec))
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["policies"] == [
        {"type": "Percent", "value": 50, "periodSeconds": 15}
    ]
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 60}]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    kubernetes_validate.validate(hpa, "1.33.0", strict=True)


@pytest.mark.parametrize("direction", ["Up", "Down"])
def test_a_direction_with_no_policy_is_refused(
    rendered: RenderFn, spec_with: SpecWith, direction: str
) -> None:
    spec = spec_with(
        autoscaling={"maxReplicas": 4, f"scale{direction}Pods": 0, f"scale{direction}Percent": 0}
    )
    with pytest.raises(InvalidSpec) as err:
        rendered(spec)
    message = str(err.value)
    assert f"autoscaling.scale{direction}Pods and autoscaling.scale{direction}Percent are " in (
        message
    )
    assert "both 0" in message
    assert "allowed: at least one of them above 0" in message


@pytest.mark.parametrize(
    ("field", "value"), [("scaleDownPercent", 101), ("scaleUpPercent", -1), ("scaleUpPods", 1025)]
)
def test_a_policy_out_of_bounds_is_refused_naming_the_field(
    rendered: RenderFn, spec_with: SpecWith, field: str, value: int
) -> None:
    spec = spec_with(autoscaling={"maxReplicas": 4, field: value})
    with pytest.raises(InvalidSpec, match=rf"spec\.autoscaling\.{field}"):
        rendered(spec)


def _pods_metric(name: str, average_value: str) -> dict[str, Any]:
    """An HPA metric averaged over the target's pods (the engines' own series)."""
    target = {"type": "AverageValue", "averageValue": average_value}
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": target}}


@pytest.mark.parametrize(
    ("metric", "target", "expected"),
    [
        pytest.param(
            "queue",
            5,
            _pods_metric("sglang:num_queue_reqs", "5"),
            id="queue-is-the-engines-waiting-requests-per-replica",
        ),
        pytest.param(
            "tokensInFlight",
            2500,
            # v6e 4x4: 16 chips per replica, and one leader reports the whole slice
            _pods_metric("sglang:num_used_tokens", "40000"),
            id="tokens-in-flight-target-is-per-chip",
        ),
        pytest.param(
            "ttft",
            0.75,
            {
                "type": "External",
                "external": {
                    "metric": {
                        "name": "model:sglang_ttft_seconds:p90_5m",
                        "selector": {"matchLabels": {"model_name": "qwen3-8b"}},  # served name
                    },
                    "target": {"type": "Value", "value": "0.75"},
                },
            },
            id="ttft-is-the-served-models-p90-from-the-recording-rule",
        ),
    ],
)
def test_each_autoscaling_metric_renders_its_hpa_metric(
    rendered: RenderFn, spec_with: SpecWith, metric: str, target: float, expected: dict[str, Any]
) -> None:
    spec = spec_with(autoscaling={"maxReplicas": 4, "metric": metric, "target": target})
    (rendered_metric,) = hpa_of(rendered(spec))["spec"]["metrics"]
    assert rendered_metric == expected


def test_the_ttft_metric_is_a_recording_rule_of_the_chart() -> None:
    assert TTFT_METRIC in {r.record for r in rules.recording_rules()}


@pytest.mark.parametrize(
    ("value", "expected"), [(8.0, "8"), (0.5, "0.5"), (1e-05, "1e-05"), (1234.25, "1234.25")]
)
def test_quantities(value: float, expected: str) -> None:
    assert quantity(value) == expected


def test_min_replicas_of_zero_scales_to_zero_through_the_operator(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(
        autoscaling={"minReplicas": 0, "maxReplicas": 4, "scaleToZero": {"idleSeconds": 60}},
        router={"hold": {"maxRequests": 32, "maxSeconds": 900}},
    )
    out = rendered(spec)
    assert hpa_of(out)["spec"]["minReplicas"] == 1  # the HPA owns 1..N, the operator 0 <-> 1
    (lease,) = [c for c in out.children if c["kind"] == "Lease"]
    assert lease["metadata"]["name"] == "qwen-demand"
    (router,) = [c for c in out.children if c["kind"] == "Deployment"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    served = out.server.valid.served_name
    assert {
        "--hold-max-requests=32",
        "--hold-max-seconds=900",
        f"--hold-models={served}",
        "--demand-lease=qwen-demand",
    } <= set(args)
    (role,) = [c for c in out.children if c["kind"] == "Role"]
    (lease_rule,) = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert lease_rule == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["qwen-demand"],
        "verbs": ["get", "patch"],
    }


def test_without_scale_to_zero_no_lease_and_no_holding(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    out = rendered(spec_with(autoscaling={"minReplicas": 1, "maxReplicas": 4}))
    assert not [c for c in out.children if c["kind"] == "Lease"]
    (router,) = [c for c in out.children if c["kind"] == "Deployment"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--hold", "--demand"))]


def test_min_replicas_of_zero_without_a_router_renders_the_lease_for_a_gateway(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """A TPUGateway holds its requests and renews its Lease (the reconciler refuses the
    server while none selects it: test_scale_to_zero.py)."""
    spec = spec_with(autoscaling={"minReplicas": 0, "maxReplicas": 4}, router={"enabled": False})
    out = rendered(spec)
    assert [c["metadata"]["name"] for c in out.children if c["kind"] == "Lease"] == ["qwen-demand"]
    assert not [c for c in out.children if c["kind"] == "Deployment"]


@pytest.mark.parametrize("idle", [0, 29, 86401])
def test_an_idle_period_out_of_bounds_is_refused(
    rendered: RenderFn, spec_with: SpecWith, idle: int
) -> None:
    spec = spec_with(
        autoscaling={"minReplicas": 0, "maxReplicas": 4, "scaleToZero": {"idleSeconds": idle}}
    )
    with pytest.raises(InvalidSpec, match=r"spec\.autoscaling\.scaleToZero\.idleSeconds"):
        rendered(spec)


def _pd(spec_with: SpecWith, prefill: dict[str, Any], decode: dict[str, Any]) -> dict[str, Any]:
    return spec_with(
        engine={"type": "simulated"},
        tpu={"generation": "v6e", "topology": "2x4"},
        disaggregation={"prefill": prefill, "decode": decode},
    )


def test_each_autoscaled_role_gets_an_hpa_on_its_own_scale_object(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    decode: dict[str, Any] = {
        "replicas": 2,
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 5,
            "metric": "tokensInFlight",
            "target": 100,
        },
    }
    prefill: dict[str, Any] = {
        "replicas": 1,
        "tpu": {"generation": "v6e", "topology": "4x4"},
        "autoscaling": {"maxReplicas": 3, "metric": "ttft", "target": 0.5},
    }
    out = rendered(_pd(spec_with, prefill, decode))
    hpas = {
        c["metadata"]["name"]: c for c in out.children if c["kind"] == "HorizontalPodAutoscaler"
    }
    assert sorted(hpas) == ["qwen-decode", "qwen-prefill"]  # and no server-wide one
    for role, hpa in (("prefill", hpas["qwen-prefill"]), ("decode", hpas["qwen-decode"])):
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": labels.API_VERSION,
            "kind": labels.ROLE_KIND,
            "name": f"qwen-{role}",
        }
        kubernetes_validate.validate(hpa, "1.33.0", strict=True)
    assert (
        hpas["qwen-decode"]["spec"]["minReplicas"],
        hpas["qwen-decode"]["spec"]["maxReplicas"],
    ) == (1, 5)
    # tokens per chip of the decode role's own slice (v6e 2x4: 8 chips)
    assert hpas["qwen-decode"]["spec"]["metrics"] == [_pods_metric("sglang:num_used_tokens", "800")]
    (ttft,) = hpas["qwen-prefill"]["spec"]["metrics"]
    assert ttft["external"]["metric"] == {
        "name": ROLE_TTFT_METRIC,
        "selector": {"matchLabels": {"model_name": "qwen3-8b", "engine_type": "prefill"}},
    }
    scales = {c["metadata"]["name"]: c for c in out.children if c["kind"] == labels.ROLE_KIND}
    assert sorted(scales) == ["qwen-decode", "qwen-prefill"]
    # no spec.replicas: applying it never takes back what the HPA set
    assert scales["qwen-decode"]["spec"] == {"role": "decode"}
    assert scales["qwen-decode"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_a_role_without_autoscaling_has_no_scale_object(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    decode = {"replicas": 1, "autoscaling": {"maxReplicas": 3}}
    out = rendered(_pd(spec_with, {"replicas": 1}, decode))
    kinds = [(c["kind"], c["metadata"]["name"]) for c in out.children]
    assert ("HorizontalPodAutoscaler", "qwen-prefill") not in kinds
    assert (labels.ROLE_KIND, "qwen-prefill") not in kinds
    assert (labels.ROLE_KIND, "qwen-decode") in kinds


def test_the_prefill_ttft_metric_is_a_recording_rule_of_the_chart() -> None:
    assert ROLE_TTFT_METRIC in {r.record for r in rules.recording_rules()}
