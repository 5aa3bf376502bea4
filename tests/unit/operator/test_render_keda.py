"""Render: KEDA's ScaledObject behind `spec.autoscaling.engine: keda`, its triggers in tokens and
seconds, and the specs refused (KEDA settings with the HPA, KEDA-only metrics with the HPA, KEDA
on a cluster without its CRDs, a backlog with no throughput to divide by)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sglang_tpu import perf_model
from sglang_tpu.topology import lookup
from tpuserve.observability import rules
from tpuserve_operator import labels, scaling_behavior
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import Rendered
from tpuserve_operator.render.autoscaler import (
    KV_USAGE,
    PREFILL_SOURCE_ANNOTATION,
    PREFILL_THROUGHPUT_ANNOTATION,
    QUEUED_PREFILL_TOKENS,
)

pytestmark = pytest.mark.unit

RenderFn = Callable[..., Rendered]
SpecWith = Callable[..., dict[str, Any]]


def kinds(rendered: Rendered, kind: str) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in rendered.children if c["kind"] == kind}


def keda(**autoscaling: Any) -> dict[str, Any]:
    return {"engine": "keda", "minReplicas": 1, "maxReplicas": 8, **autoscaling}


def test_keda_renders_a_scaled_object_on_the_servers_scale_subresource_and_no_hpa(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(autoscaling=keda(minReplicas=2, metric="queue", target=4,
                                      keda={"pollingIntervalSeconds": 30}))  # fmt: skip
    out = rendered(spec, keda=True, keda_prometheus_url="http://prom.mon:9090")
    assert kinds(out, "HorizontalPodAutoscaler") == {}
    scaled = kinds(out, "ScaledObject")["qwen"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    body = scaled["spec"]
    assert body["scaleTargetRef"] == {
        "apiVersion": labels.API_VERSION, "kind": labels.KIND, "name": "qwen"
    }  # fmt: skip
    assert (body["minReplicaCount"], body["maxReplicaCount"], body["pollingInterval"]) == (2, 8, 30)
    # the HPA's behaviour, the same object (KEDA copies it into its own HPA)
    behavior = body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == scaling_behavior.DEFAULT.manifest()
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert behavior["scaleDown"]["policies"][1] == {
        "type": "Percent", "value": 10, "periodSeconds": 60
    }  # fmt: skip
    (trigger,) = body["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": "http://prom.mon:9090",
        "query": 'sum(sglang:num_queue_reqs{namespace="ml", model_name="qwen3-8b", '
        'tp_rank="0", pp_rank="0"})',
        "threshold": "4",
    }


def test_backlog_seconds_divides_queued_prefill_tokens_by_the_performance_models_throughput(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(autoscaling=keda(metric="backlogSeconds", target=0.5))
    scaled = kinds(rendered(spec, keda=True), "ScaledObject")["qwen"]
    expected = round(
        perf_model.peak_prefill_tokens_per_second(
            lookup("v6e", "4x4"), perf_model.get_profile("qwen3-8b")
        )
    )
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["name"] == "backlog-seconds"
    assert trigger["metadata"]["query"] == (
        f'sum({QUEUED_PREFILL_TOKENS}{{namespace="ml", model_name="qwen3-8b"}}) / {expected}'
    )
    assert trigger["metadata"]["threshold"] == "0.5"
    annotations = scaled["metadata"]["annotations"]
    assert annotations[PREFILL_THROUGHPUT_ANNOTATION] == str(expected)
    assert "perf_model" in annotations[PREFILL_SOURCE_ANNOTATION]
    assert "v6e 4x4" in annotations[PREFILL_SOURCE_ANNOTATION]


def test_a_calibrated_throughput_overrides_the_performance_model(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(
        autoscaling=keda(metric="backlogSeconds", target=1, prefillTokensPerSecond=15928)
    )
    scaled = kinds(rendered(spec, keda=True), "ScaledObject")["qwen"]
    assert scaled["spec"]["triggers"][0]["metadata"]["query"].endswith(" / 15928")
    source = scaled["metadata"]["annotations"][PREFILL_SOURCE_ANNOTATION]
    assert source == "autoscaling.prefillTokensPerSecond"


def test_backlog_seconds_without_a_known_model_or_a_throughput_is_refused(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(
        model={"source": "hf://acme/secret-model"},
        autoscaling=keda(metric="backlogSeconds", target=1),
    )
    with pytest.raises(InvalidSpec, match=r"spec\.autoscaling\.metric: backlogSeconds needs .*"
                       r"'acme/secret-model'.*prefillTokensPerSecond"):  # fmt: skip
        rendered(spec, keda=True)


def test_kv_cache_usage_and_the_ttft_slo_mode(rendered: RenderFn, spec_with: SpecWith) -> None:
    kv = kinds(rendered(spec_with(autoscaling=keda(metric="kvCacheUsage", target=0.7)),
                        keda=True), "ScaledObject")["qwen"]  # fmt: skip
    (trigger,) = kv["spec"]["triggers"]
    assert trigger["metadata"]["query"] == (
        f'sum({KV_USAGE}{{namespace="ml", model_name="qwen3-8b"}})'
    )
    assert (trigger["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "0.7")
    slo = kinds(rendered(spec_with(autoscaling=keda(metric="ttft", target=2)), keda=True),
                "ScaledObject")["qwen"]  # fmt: skip
    (trigger,) = slo["spec"]["triggers"]
    assert trigger["metadata"]["query"] == (
        'max(model:sglang_ttft_seconds:p90_5m{model_name="qwen3-8b"}) / 2'
    )
    assert (trigger["metricType"], trigger["metadata"]["threshold"]) == ("Value", "1")


def test_the_triggers_read_recording_rules_of_the_chart() -> None:
    records = {r.record for r in rules.recording_rules()}
    assert {QUEUED_PREFILL_TOKENS, KV_USAGE} <= records


def test_keda_on_a_cluster_without_its_crds_is_refused_naming_the_field(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.autoscaling\.engine: keda needs KEDA's "
                       r"ScaledObject API \(scaledobjects\.keda\.sh\)"):  # fmt: skip
        rendered(spec_with(autoscaling=keda()), keda=False)


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"maxReplicas": 4, "keda": {}}, r"autoscaling\.keda is set with autoscaling\.engine hpa"),
        ({"maxReplicas": 4, "metric": "backlogSeconds"},
         r"backlogSeconds and kvCacheUsage need autoscaling\.engine keda"),
        ({"maxReplicas": 4, "metric": "kvCacheUsage", "target": 0.5},
         r"backlogSeconds and kvCacheUsage need autoscaling\.engine keda"),
        (keda(metric="kvCacheUsage", target=1.5), r"share of the KV pool"),
    ],
    ids=["keda-settings-with-hpa", "backlog-with-hpa", "kv-with-hpa", "kv>1"],
)  # fmt: skip
def test_autoscaler_combinations_that_cannot_work_are_refused(
    rendered: RenderFn, spec_with: SpecWith, autoscaling: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSpec, match=message):
        rendered(spec_with(autoscaling=autoscaling), keda=True)


def test_each_pd_role_gets_its_own_scaled_object_on_its_role_object(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(
        engine={"type": "simulated"},
        tpu={"generation": "v6e", "topology": "2x4"},
        disaggregation={
            "prefill": {"replicas": 1, "autoscaling": keda(metric="backlogSeconds", target=1)},
            "decode": {"replicas": 1, "autoscaling": keda(metric="kvCacheUsage", target=0.8)},
        },
    )
    scaled = kinds(rendered(spec, keda=True), "ScaledObject")
    assert sorted(scaled) == ["qwen-decode", "qwen-prefill"]
    for role in ("prefill", "decode"):
        assert scaled[f"qwen-{role}"]["spec"]["scaleTargetRef"] == {
            "apiVersion": labels.API_VERSION, "kind": labels.ROLE_KIND, "name": f"qwen-{role}"
        }  # fmt: skip
    prefill = scaled["qwen-prefill"]["spec"]["triggers"][0]["metadata"]["query"]
    assert 'engine_type="prefill"' in prefill
    assert QUEUED_PREFILL_TOKENS in prefill
    decode = scaled["qwen-decode"]["spec"]["triggers"][0]["metadata"]["query"]
    assert 'engine_type="decode"' in decode
    assert KV_USAGE in decode


def test_a_role_may_not_scale_on_the_other_roles_signal(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(
        engine={"type": "simulated"},
        tpu={"generation": "v6e", "topology": "2x4"},
        disaggregation={
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1, "autoscaling": keda(metric="backlogSeconds", target=1)},
        },
    )
    with pytest.raises(InvalidSpec, match=r"spec\.disaggregation\.decode\.autoscaling\.metric: "
                       r"'backlogSeconds' is not allowed for the decode role"):  # fmt: skip
        rendered(spec, keda=True)


def test_a_predictive_floor_is_a_second_trigger_against_requests_per_replica(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    floor = {"requestsPerReplica": 5.25, "horizonSeconds": 480, "windowSeconds": 900}
    spec = spec_with(autoscaling=keda(metric="backlogSeconds", target=1,
                                      keda={"predictiveFloor": floor}))  # fmt: skip
    scaled = kinds(rendered(spec, keda=True), "ScaledObject")["qwen"]
    backlog, predicted = scaled["spec"]["triggers"]
    assert backlog["name"] == "backlog-seconds"  # KEDA scales to the larger of the two
    assert predicted["name"] == "predictive-floor"
    assert (predicted["metricType"], predicted["metadata"]["threshold"]) == ("AverageValue", "5.25")
    query = predicted["metadata"]["query"]
    # the trend: the line through the medians of the window's two halves (450 s each), one
    # horizon ahead of the recent half's median time ((450 - 30) / 2 = 210 s ago)
    assert "predict_linear" not in query
    assert 'quantile_over_time(0.5, (sum(rate(sglang:num_requests_total{namespace="ml"' in query
    assert "[450s:30s])" in query
    assert "[450s:30s] offset 450s)" in query
    assert " * 690 / 450)" in query  # 480 + 210 s ahead of the recent median, halves 450 s apart
    assert " * 210 / 450)" in query  # the level now, for the daily shape
    assert "avg_over_time((sum(rate(sglang:num_requests_total" in query  # the 4x cap
    assert "offset 85920s" in query  # yesterday, one horizon after this time of day
    assert "offset 86400s" in query
    without = kinds(rendered(spec_with(autoscaling=keda()), keda=True), "ScaledObject")["qwen"]
    assert len(without["spec"]["triggers"]) == 1


def test_keda_to_zero_activates_on_the_routers_demand_and_cools_down_for_the_idle_period(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    floor = {"requestsPerReplica": 5}
    spec = spec_with(autoscaling=keda(minReplicas=0, metric="queue", target=4,
                                      scaleToZero={"idleSeconds": 90},
                                      keda={"predictiveFloor": floor}))  # fmt: skip
    body = kinds(rendered(spec, keda=True), "ScaledObject")["qwen"]["spec"]
    assert (body["minReplicaCount"], body["cooldownPeriod"]) == (0, 90)
    names = [t["name"] for t in body["triggers"]]
    assert names == ["queue", "predictive-floor", "router-demand"]  # the floor stays KEDA's s1
    demand = body["triggers"][2]
    assert demand["metricType"] == "AverageValue"
    assert demand["metadata"]["threshold"] == "1000000"  # activation only: at most 1 replica
    query = demand["metadata"]["query"]
    assert (
        'sum(tpuserve_router_held_requests{namespace="ml", model="qwen3-8b"}) or vector(0)' in query
    )
    assert 'rate(tpuserve_router_requests_total{namespace="ml", model="qwen3-8b"}[1m])' in query
    one = kinds(rendered(spec_with(autoscaling=keda()), keda=True), "ScaledObject")["qwen"]
    assert "cooldownPeriod" not in one["spec"]
    assert [t["name"] for t in one["spec"]["triggers"]] == ["queue"]
