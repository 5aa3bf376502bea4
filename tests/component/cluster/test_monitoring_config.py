"""The local cluster's Prometheus configuration is what the Prometheus Operator makes of the
chart's monitors: the chart's PodMonitor selects exactly the leader pods on their `http` port,
with the operator's target labels, over the labels Kubernetes discovery gives pods."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chart_helpers import MONITORING_APIS, find_tool, make_renderer
from tpuserve.cluster.monitoring import translate

pytestmark = pytest.mark.component  # renders the chart with the real helm


def pod(name: str, labels: dict[str, str], ports: dict[str, int], phase: str = "Running") -> Any:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": name, "labels": labels},
        "spec": {
            "nodeName": "n",
            "containers": [
                {"name": "c", "ports": [{"name": k, "containerPort": v} for k, v in ports.items()]}
            ],
        },
        "status": {"podIP": "127.244.0.9", "phase": phase, "conditions": []},
    }


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's relabelling (keep, drop, replace), enough for these configurations."""
    labels = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(
            labels.get(s, "") for s in rule.get("source_labels", [])
        )
        matched = re.fullmatch(rule.get("regex", "(.*)"), value)
        if action == "keep" and not matched:
            return None
        if action == "drop" and matched:
            return None
        if action == "replace" and matched:
            labels[rule["target_label"]] = matched.expand(
                rule.get("replacement", "$1").replace("$1", r"\1")
            )
    return {k: v for k, v in labels.items() if not k.startswith("__meta_")}


def test_the_charts_model_server_monitor_scrapes_leaders_on_http(tmp_path: Path) -> None:
    render = make_renderer(find_tool("helm"))
    objects = render(api_versions=MONITORING_APIS)
    (monitor,) = [o for o in objects if o["metadata"]["name"].endswith("-model-server")]
    (job,) = translate.pod_monitor_jobs(monitor, tmp_path)
    assert job["file_sd_configs"] == [
        {"files": [str(tmp_path / translate.sd_file(job["job_name"]))], "refresh_interval": "5s"}
    ]
    leader_labels = {
        "app.kubernetes.io/name": "tpuserve",
        "app.kubernetes.io/component": "model-server",
        "serving.tpuserve.dev/role": "leader",
        "model": "qwen3-8b",
        "tpu-generation": "v6e",
    }
    targets = translate.pod_targets(
        [
            pod("leader", leader_labels, {"http": 30000, "kv-events": 5557}),
            pod(
                "worker", {**leader_labels, "serving.tpuserve.dev/role": "worker"}, {"http": 30000}
            ),
            pod("done", leader_labels, {"http": 30000}, phase="Succeeded"),
        ]
    )
    kept = [
        t
        for g in targets
        if (t := relabel(job["relabel_configs"], {**g["labels"], "__address__": g["targets"][0]}))
    ]
    assert len(kept) == 1
    (target,) = kept
    assert target["__address__"] == "127.244.0.9:30000"
    assert target["job"] == f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    assert (target["namespace"], target["pod"], target["endpoint"]) == ("ml", "leader", "http")
    assert (target["model"], target["tpu_generation"]) == ("qwen3-8b", "v6e")
    assert job["scrape_interval"] == monitor["spec"]["podMetricsEndpoints"][0]["interval"]


def test_a_service_monitor_scrapes_the_pods_behind_the_service(tmp_path: Path) -> None:
    monitor = {
        "metadata": {"name": "op", "namespace": "sys"},
        "spec": {"selector": {"matchLabels": {"app": "op"}}, "endpoints": [{"port": "metrics"}]},
    }
    service = {
        "metadata": {"name": "op-svc", "namespace": "sys", "labels": {"app": "op"}},
        "spec": {
            "selector": {"run": "op"},
            "ports": [{"name": "metrics", "port": 80, "targetPort": "m"}],
        },
    }
    (job,) = translate.service_monitor_jobs(monitor, [service], tmp_path)
    labels = pod("op-0", {"run": "op"}, {"m": 9090})["metadata"]["labels"]
    group = translate.pod_targets([pod("op-0", labels, {"m": 9090, "other": 1})])
    kept = [t for g in group if (t := relabel(job["relabel_configs"], dict(g["labels"])))]
    assert [(t["job"], t["service"], t["pod"]) for t in kept] == [("op-svc", "op-svc", "op-0")]


def test_rules_and_selectors_translate_as_the_operator_does() -> None:
    rules = translate.selector_relabelings(
        {"matchLabels": {"a.b/c": "x"}, "matchExpressions": [{"key": "d", "operator": "Exists"}]}
    )
    assert rules[0]["source_labels"] == [
        "__meta_kubernetes_pod_label_a_b_c",
        "__meta_kubernetes_pod_labelpresent_a_b_c",
    ]
    assert rules[1] == {
        "action": "keep",
        "source_labels": ["__meta_kubernetes_pod_labelpresent_d"],
        "regex": "true",
    }
    assert translate.relabelings(
        [{"sourceLabels": ["x"], "targetLabel": "y", "action": "Replace"}]
    ) == [{"source_labels": ["x"], "target_label": "y", "action": "replace"}]
    rule = {
        "metadata": {"name": "r", "namespace": "n"},
        "spec": {"groups": [{"name": "g", "rules": []}]},
    }
    assert translate.rule_file(rule) == {"groups": [{"name": "g", "rules": []}]}
