"""What every rule and alert is built from: the SLO (`TTFT_SLO_SECONDS`, `ITL_SLO_SECONDS`,
`SLO_OBJECTIVE`, the burn rates), the names of the router's and the operator's series they
read, the rule types (`Recording`, `Alert`, `Group`) and the PromQL they share (rates,
good ratios, quantiles, an engine's series from the router's, `at_engine_pods`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_tpu import metric_names as sg

# The latency SLO the burn-rate alerts and good-ratio series encode.
TTFT_SLO_SECONDS = 2.0
ITL_SLO_SECONDS = 0.1
SLO_OBJECTIVE = 0.99  # 99 % of requests (TTFT) / tokens (ITL) within the threshold
# Multi-window, multi-burn-rate alerting (Google SRE workbook, "Alerting on SLOs"): page when
# 2 % of a 30-day budget burns in 1 h (14.4x), ticket when 5 % burns in 6 h (6x).
FAST_BURN_RATE = 14.4
SLOW_BURN_RATE = 6.0

if TTFT_SLO_SECONDS not in sg.TTFT_BUCKETS_SECONDS:
    raise AssertionError("TTFT_SLO_SECONDS must be a bucket boundary of SGLang's TTFT histogram")
if ITL_SLO_SECONDS not in sg.ITL_BUCKETS_SECONDS:
    raise AssertionError("ITL_SLO_SECONDS must be a bucket boundary of SGLang's ITL histogram")

# Labels a pod-level series keeps: where it runs, what it serves, on which slice.
POD = "namespace, pod, model_name, tpu_generation, tpu_topology"
RANK0 = 'tp_rank="0", pp_rank="0"'
# Router series the fallbacks read (declared in router/tpuserve_router/metrics.py).
ROUTER_PROMPT_TOKENS = "tpuserve_router_prompt_tokens_total"
ROUTER_CACHED_TOKENS = "tpuserve_router_cached_tokens_total"
ROUTER_COMPLETION_TOKENS = "tpuserve_router_completion_tokens_total"
ROUTER_TTFT = "tpuserve_router_ttft_seconds"
ROUTER_E2E = "tpuserve_router_e2e_latency_seconds"
ROUTER_ENGINE_REQUESTS = "tpuserve_router_worker_engine_requests"
ROUTER_KV_USAGE = "tpuserve_router_worker_kv_usage"
ANSWERED = 'worker!="none", status=~"2.."'
# Router series the alerts read (declared in router/tpuserve_router/metrics.py).
ROUTER_WORKER_HEALTHY = "tpuserve_router_worker_healthy"
ROUTER_REQUESTS = "tpuserve_router_requests_total"
ROUTER_UPSTREAM_ERRORS = "tpuserve_router_upstream_errors_total"
ROUTER_KV_EVENT_GAPS = "tpuserve_router_kv_event_gaps_total"
ROUTER_DEMAND_SIGNALS = "tpuserve_router_demand_signals_total"
# Operator series (declared in operator/tpuserve_operator/metrics.py).
OPERATOR_RECONCILES = "tpuserve_operator_reconciles_total"
UNSCHEDULABLE_PODS = "tpuserve_unschedulable_pods"
# Every scraped model-server pod with its labels, by the address Prometheus scraped (1 each).
ENGINE_PODS = (
    "group by (instance, namespace, pod, model, tpu_generation, tpu_topology) "
    '(up{job=~".*model-server"})'
)


def at_engine_pods(by_worker: str, agg: str = "sum", by: str = POD, role: bool = False) -> str:
    """``by_worker`` (a router vector by ``worker``, every router replica summed or maxed) on
    the engine pods' labels: ``worker`` ``http://IP:PORT`` is the ``instance`` of the engine
    pod's scrape target, whose ``up`` gives namespace, pod, model (as ``model_name``) and
    slice. ``role`` adds ``engine_type="unified"`` (SGLang's label of a colocated engine)."""
    inner = f'label_replace({by_worker}, "instance", "$1", "worker", "https?://(.+)")'
    if role:
        inner = f'label_replace({inner}, "engine_type", "unified", "worker", ".*")'
    return (
        f"{agg} by ({by}) (\n  label_replace(\n    {inner}\n"
        "    * on (instance) group_left (namespace, pod, model, tpu_generation, tpu_topology)\n"
        f'    {ENGINE_PODS},\n    "model_name", "$1", "model", "(.+)"\n  )\n)'
    )


def pod_rate(
    sglang: str, router: str, window: str, selector: str = "", by: str = POD, role: bool = False
) -> str:
    """An engine's counter rate per pod: its ``sglang:`` series, else the router's."""
    own = f"sum by ({by}) ({counter_rate(sglang, window, selector)})"
    answered = ANSWERED if router == ROUTER_REQUESTS else ""
    fallback = at_engine_pods(f"sum by (worker) ({counter_rate(router, window, answered)})", by=by,
                               role=role)  # fmt: skip
    return f"{own}\nor\n{fallback}"


def model_router(expr_by_model: str) -> str:
    """A router vector by ``model`` relabelled ``model_name``."""
    return f'label_replace({expr_by_model}, "model_name", "$1", "model", "(.+)")'


@dataclass(frozen=True, slots=True)
class Recording:
    record: str
    expr: str
    doc: str  # one sentence for docs/observability.md
    labels: dict[str, str] = field(default_factory=dict)

    def to_rule(self) -> dict[str, object]:
        rule: dict[str, object] = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True, slots=True)
class Alert:
    alert: str
    expr: str
    for_: str
    severity: str  # critical pages, warning tickets, info informs
    summary: str
    description: str  # may use {{ $labels.x }} and {{ $value }}

    def to_rule(self) -> dict[str, object]:
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    rules: tuple[Recording | Alert, ...]

    def to_group(self) -> dict[str, object]:
        return {"name": self.name, "rules": [r.to_rule() for r in self.rules]}


def counter_rate(metric: str, window: str, selector: str = "") -> str:
    return f"rate({metric}{{{selector}}}[{window}])" if selector else f"rate({metric}[{window}])"


def good_ratio(histogram: sg.MetricSpec, threshold: float, window: str) -> str:
    bucket, count = f"{histogram.name}_bucket", f"{histogram.name}_count"
    le = f'le="{threshold!r}"'
    own = (
        f"sum by (model_name) ({counter_rate(bucket, window, le)})\n"
        f"  / (sum by (model_name) ({counter_rate(count, window)}) > 0)"
    )
    router = ROUTER_HISTOGRAMS.get(histogram.name)
    if router is None:
        return own
    good = model_router(f"sum by (model) ({counter_rate(router + '_bucket', window, le)})")
    total = model_router(f"sum by (model) ({counter_rate(router + '_count', window)})")
    good, total = f"sum by (model_name) ({good})", f"sum by (model_name) ({total})"
    return f"{own}\nor\n{good}\n  / ({total} > 0)"


def quantile(q: float, histogram: sg.MetricSpec, window: str, by: str = "model_name") -> str:
    rate = counter_rate(histogram.name + "_bucket", window)
    own = f"histogram_quantile({q}, sum by (le, {by}) ({rate}))"
    router = ROUTER_HISTOGRAMS.get(histogram.name)
    if router is None:
        return own
    buckets = model_router(counter_rate(router + "_bucket", window))
    if "engine_type" in by:
        buckets = f'label_replace({buckets}, "engine_type", "unified", "model", ".*")'
    return f"{own}\nor\nhistogram_quantile({q}, sum by (le, {by}) ({buckets}))"


ROUTER_HISTOGRAMS = {
    sg.TIME_TO_FIRST_TOKEN.name: ROUTER_TTFT,
    sg.E2E_REQUEST_LATENCY.name: ROUTER_E2E,
}
"""SGLang's histograms the router has its own of (TTFT of streamed requests, end to end), for
an engine without SGLang's series. Inter-token latency and queue time it does not see."""
