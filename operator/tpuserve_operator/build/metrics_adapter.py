"""Prometheus Adapter rules that serve the metrics the operator's HorizontalPodAutoscaler reads.

The HPA (`render/autoscaler.py`) asks the custom metrics API for the Pods metrics
`sglang:num_queue_reqs` and `sglang:num_used_tokens` of the leader pods (a disaggregated role's
HPA: of that role's leaders, the scale selector), and the external metrics API for
`model:sglang_ttft_seconds:p90_5m` of the served model (a prefill role's HPA:
`model_role:sglang_ttft_seconds:p90_5m` of its `engine_type="prefill"` engines). These rules make
Prometheus Adapter (kubernetes-sigs/prometheus-adapter) serve exactly those names from the
series the chart's monitors scrape (labelled `namespace` and `pod`) and the chart's recording
rule. Written to `charts/tpuserve/files/prometheus-adapter-rules.yaml`: give it to the adapter
as its `--config` (the prometheus-community chart takes it as `rules.custom` and
`rules.external`); the local cluster's adapter runs with it.
"""

from __future__ import annotations

from typing import Any

from tpuserve_operator.render.autoscaler import (
    QUEUE_METRIC,
    ROLE_TTFT_METRIC,
    TOKENS_IN_FLIGHT_METRIC,
    TTFT_METRIC,
)

POD_METRICS = (QUEUE_METRIC, TOKENS_IN_FLIGHT_METRIC)
EXTERNAL_METRICS = (TTFT_METRIC, ROLE_TTFT_METRIC)


def _exactly(name: str) -> dict[str, str]:
    escaped = name.replace(".", r"\.")
    return {"matches": f"^{escaped}$", "as": name}


def adapter_config() -> dict[str, Any]:
    return {
        "rules": [
            {
                "seriesQuery": f'{name}{{namespace!="",pod!=""}}',
                "resources": {
                    "overrides": {
                        "namespace": {"resource": "namespace"},
                        "pod": {"resource": "pod"},
                    }
                },
                "name": _exactly(name),
                "metricsQuery": "sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})",
            }
            for name in POD_METRICS
        ],
        "externalRules": [
            {
                "seriesQuery": name,
                "resources": {"namespaced": False},
                "name": _exactly(name),
                "metricsQuery": "max by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})",
            }
            for name in EXTERNAL_METRICS
        ],
    }
