"""promtool unit tests of every alert (`tpuserve/observability/alert_rules.py`) on the fleet fixture
(`fleet_series`): each alert fires on the series that should fire it and stays silent on the
ones that should not. `rule_tests.promtool_test_file` puts them in the test file."""

from __future__ import annotations

from typing import Any

from sglang_tpu import metric_names as sg
from tests.metrics.promtool.fleet_series import (
    NS,
    _alert,
    _engine,
    _series,
)
from tpuserve.observability import rule_basis


def alert_tests() -> list[dict[str, Any]]:
    ttft_b, ttft_c = f"{sg.TIME_TO_FIRST_TOKEN.name}_bucket", f"{sg.TIME_TO_FIRST_TOKEN.name}_count"
    burn_series = []
    # "slow": every request misses 2 s; "meh": 10 % miss (slow burn only); "fine": none miss.
    for model, good_per_min in (("slow", 0), ("meh", 54), ("fine", 60)):
        labels = _engine(
            sg.TIME_TO_FIRST_TOKEN, {"namespace": NS, "pod": f"{model}-0", "model_name": model}
        )
        burn_series.append(_series(ttft_b, {**labels, "le": "2.0"}, f"0+{good_per_min}x420"))
        burn_series.append(_series(ttft_c, labels, "0+60x420"))
    # Prefix collapse: "dropped" serves 60 % from cache for 6h40m, then 10 %; "steady" stays.
    prompt, cached = sg.PROMPT_TOKENS, sg.CACHED_TOKENS
    dropped, steady = {"model_name": "dropped"}, {"model_name": "steady"}
    prefix_series = [
        _series(prompt.name, _engine(prompt, dropped), "0+600x430"),
        _series(cached.name, _engine(cached, dropped), "0+360x400 144060+60x30"),
        _series(prompt.name, _engine(prompt, steady), "0+600x430"),
        _series(cached.name, _engine(cached, steady), "0+360x430"),
    ]
    queue_series = [
        _series(spec.name, _engine(spec, {"namespace": NS, "pod": pod, "model_name": "m"}), values)
        for spec, pod, values in (
            (sg.NUM_QUEUE_REQS, "full-0", "5+0x30"),
            (sg.TOKEN_USAGE, "full-0", "0.95+0x30"),
            (sg.NUM_QUEUE_REQS, "roomy-0", "5+0x30"),
            (sg.TOKEN_USAGE, "roomy-0", "0.5+0x30"),
        )
    ]
    router = {"namespace": NS, "pod": "router-0"}
    router_series = [
        _series(
            rule_basis.ROUTER_WORKER_HEALTHY, {**router, "model": "llama", "worker": "w0"}, "0+0x20"
        ),
        _series(
            rule_basis.ROUTER_WORKER_HEALTHY, {**router, "model": "llama", "worker": "w1"}, "0+0x20"
        ),
        _series(
            rule_basis.ROUTER_WORKER_HEALTHY, {**router, "model": "qwen", "worker": "w2"}, "1+0x20"
        ),
        _series(
            rule_basis.ROUTER_REQUESTS,
            {
                **router,
                "model": "llama",
                "worker": "w0",
                "route": "/v1/completions",
                "status": "200",
            },
            "0+100x20",
        ),
        _series(
            rule_basis.ROUTER_UPSTREAM_ERRORS,
            {**router, "worker": "w0", "reason": "connect_error"},
            "0+10x20",
        ),
        _series(
            rule_basis.ROUTER_REQUESTS,
            {
                "namespace": NS,
                "pod": "router-1",
                "model": "qwen",
                "worker": "w2",
                "route": "/v1/completions",
                "status": "200",
            },
            "0+100x20",
        ),
        _series(
            rule_basis.ROUTER_UPSTREAM_ERRORS,
            {"namespace": NS, "pod": "router-1", "worker": "w2", "reason": "connect_error"},
            "0+1x20",
        ),
        _series(rule_basis.ROUTER_KV_EVENT_GAPS, {**router, "worker": "w0"}, "0+0x5 1+0x15"),
        _series(rule_basis.ROUTER_KV_EVENT_GAPS, {**router, "worker": "w1"}, "0+0x20"),
    ]
    operator = {"namespace": "tpuserve-system", "pod": "tpuserve-operator-0"}
    operator_series = [
        # errors every minute for 40 minutes, then none
        _series(rule_basis.OPERATOR_RECONCILES, {**operator, "result": "error"}, "0+1x40 40+0x30"),
        _series(rule_basis.OPERATOR_RECONCILES, {**operator, "result": "ok"}, "0+10x70"),
        # a standby operator: no errors
        _series(
            rule_basis.OPERATOR_RECONCILES,
            {**operator, "pod": "tpuserve-operator-1", "result": "error"},
            "0+0x70",
        ),
    ]
    stuck = {"namespace": NS, "tpumodelserver": "big", "tpu_generation": "v6e",
             "tpu_topology": "4x4"}  # fmt: skip
    placed = {**stuck, "tpumodelserver": "small", "tpu_topology": "2x4"}
    unschedulable_series = [
        # two operator replicas export the same server (HA): one alert, not two
        _series(rule_basis.UNSCHEDULABLE_PODS, {**stuck, "pod": "op-0"}, "4+0x30"),
        _series(rule_basis.UNSCHEDULABLE_PODS, {**stuck, "pod": "op-1"}, "4+0x30"),
        # pending for 5 minutes while the autoscaler adds a node, then placed: quiet
        _series(rule_basis.UNSCHEDULABLE_PODS, {**placed, "pod": "op-0"}, "2+0x5 0+0x25"),
    ]
    down = {"job": f"{NS}/tpuserve-model-server", "namespace": NS, "pod": "dead-0"}
    up_series = [
        _series("up", down, "0+0x30"),
        _series("up", {**down, "pod": "alive-0"}, "1+0x30"),
    ]
    return [
        {
            "name": "TTFT burn: fast burn pages, slow burn tickets, a healthy model stays quiet",
            "interval": "1m",
            "input_series": burn_series,
            "alert_rule_test": [
                {
                    "eval_time": "10m",
                    "alertname": "TPUServeTTFTBudgetFastBurn",
                    "exp_alerts": [_alert("TPUServeTTFTBudgetFastBurn", {"model_name": "slow"})],
                },
                {"eval_time": "1m", "alertname": "TPUServeTTFTBudgetFastBurn", "exp_alerts": []},
                {
                    "eval_time": "400m",
                    "alertname": "TPUServeTTFTBudgetSlowBurn",
                    "exp_alerts": [
                        _alert("TPUServeTTFTBudgetSlowBurn", {"model_name": "meh"}),
                        _alert("TPUServeTTFTBudgetSlowBurn", {"model_name": "slow"}),
                    ],
                },
            ],
        },
        {
            "name": "queue backlog fires only on a saturated replica",
            "interval": "1m",
            "input_series": queue_series,
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "TPUServeQueueBacklog", "exp_alerts": []},
                {
                    "eval_time": "15m",
                    "alertname": "TPUServeQueueBacklog",
                    "exp_alerts": [
                        _alert(
                            "TPUServeQueueBacklog",
                            {"namespace": NS, "pod": "full-0", "model_name": "m"},
                        )
                    ],
                },
            ],
        },
        {
            "name": "prefix hit ratio collapse fires when the ratio falls below half its 6h level",
            "interval": "1m",
            "input_series": prefix_series,
            "alert_rule_test": [
                {
                    "eval_time": "390m",
                    "alertname": "TPUServePrefixHitRatioCollapse",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "425m",
                    "alertname": "TPUServePrefixHitRatioCollapse",
                    "exp_alerts": [
                        _alert("TPUServePrefixHitRatioCollapse", {"model_name": "dropped"})
                    ],
                },
            ],
        },
        {
            "name": "router alerts: no healthy worker, upstream errors over 5 %, KV-event gaps",
            "interval": "1m",
            "input_series": router_series,
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "TPUServeNoReadyReplicas", "exp_alerts": []},
                {
                    "eval_time": "5m",
                    "alertname": "TPUServeNoReadyReplicas",
                    "exp_alerts": [
                        _alert("TPUServeNoReadyReplicas", {"namespace": NS, "model": "llama"})
                    ],
                },
                {
                    "eval_time": "15m",
                    "alertname": "TPUServeRouterUpstreamErrors",
                    "exp_alerts": [_alert("TPUServeRouterUpstreamErrors", router)],
                },
                {"eval_time": "4m", "alertname": "TPUServeKVEventGaps", "exp_alerts": []},
                {
                    "eval_time": "8m",
                    "alertname": "TPUServeKVEventGaps",
                    "exp_alerts": [_alert("TPUServeKVEventGaps", {**router, "worker": "w0"})],
                },
                {"eval_time": "19m", "alertname": "TPUServeKVEventGaps", "exp_alerts": []},
            ],
        },
        {
            "name": "demand Lease: all writes failing alert, some failures among successes do not",
            "interval": "1m",
            "input_series": [
                _series(rule_basis.ROUTER_DEMAND_SIGNALS, {**router, "result": "failed"}, "0+1x20"),
                _series(rule_basis.ROUTER_DEMAND_SIGNALS, {**router, "result": "ok"}, "5+0x20"),
                _series(
                    rule_basis.ROUTER_DEMAND_SIGNALS,
                    {"namespace": NS, "pod": "router-1", "result": "failed"},
                    "0+1x20",
                ),
                _series(
                    rule_basis.ROUTER_DEMAND_SIGNALS,
                    {"namespace": NS, "pod": "router-1", "result": "ok"},
                    "0+10x20",
                ),
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "TPUServeDemandSignalFailing", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "TPUServeDemandSignalFailing",
                    "exp_alerts": [_alert("TPUServeDemandSignalFailing", router)],
                },
            ],
        },
        {
            "name": "operator: reconcile errors that persist for 15 minutes, a standby is quiet",
            "interval": "1m",
            "input_series": operator_series,
            "alert_rule_test": [
                {
                    "eval_time": "10m",
                    "alertname": "TPUServeOperatorReconcileErrors",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "30m",
                    "alertname": "TPUServeOperatorReconcileErrors",
                    "exp_alerts": [_alert("TPUServeOperatorReconcileErrors", operator)],
                },
                {
                    "eval_time": "65m",
                    "alertname": "TPUServeOperatorReconcileErrors",
                    "exp_alerts": [],
                },
            ],
        },
        {
            "name": "TPU pods unschedulable for 15 minutes, once per server, not while scaling up",
            "interval": "1m",
            "input_series": unschedulable_series,
            "alert_rule_test": [
                {
                    "eval_time": "10m",
                    "alertname": "TPUServeTPUPodsUnschedulable",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "20m",
                    "alertname": "TPUServeTPUPodsUnschedulable",
                    "exp_alerts": [_alert("TPUServeTPUPodsUnschedulable", stuck)],
                },
            ],
        },
        {
            "name": "a model server that cannot be scraped for 5 minutes pages",
            "interval": "1m",
            "input_series": up_series,
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "TPUServeModelServerDown", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "TPUServeModelServerDown",
                    "exp_alerts": [_alert("TPUServeModelServerDown", down)],
                },
            ],
        },
    ]
