"""Prefill/decode: a disaggregated server's pairs as the router serves them (how requests were
served, failed legs, the client's TTFT of a pair, prefill and KV-transfer time), and its engines
by role (TTFT and ITL by engine_type, PD queues, KV transfers, bootstrap and transfer failures).
Router series are declared in router/tpuserve_router/metrics.py, the engines' in
sglang_tpu/metric_names.py (PD_METRICS, exported by engines in prefill or decode mode)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from sglang_tpu import metric_names as sg
from tpuserve.observability import rule_basis
from tpuserve.observability.dashboards.common import (
    MODEL,
    Ids,
    base_dashboard,
    target,
    timeseries_panel,
)

RI = "$__rate_interval"
ROUTER_MODEL = 'model=~"$model_name"'  # the router's `model` label is the served name


def _quantiles(histogram: str, by: str, selector: str = "") -> tuple[tuple[str, str], ...]:
    """p50 and p99 of ``histogram`` summed by ``by`` (labels, comma-separated; "" for none)."""
    legend = " ".join("{{" + label.strip() + "}}" for label in by.split(",") if label.strip())
    series = f"{histogram}_bucket{{{selector}}}" if selector else f"{histogram}_bucket"
    return tuple(
        target(
            f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) (rate({series}[{RI}])))",
            f"{legend} p{round(q * 100)}".strip(),
        )
        for q in (0.5, 0.99)
    )


def build() -> Dashboard:
    ids = Ids()
    m = f"{{{MODEL}}}"
    rank0 = f"{MODEL}, {rule_basis.RANK0}"
    return (
        base_dashboard(
            "tpuserve / Prefill-decode",
            "tpuserve-pd",
            "Disaggregated servers (spec.disaggregation): pairs as the router serves them, "
            "and the prefill and decode engines by role.",
            model_variable=True,
        )
        .with_row(Row("Pairs (router)"))
        .with_panel(
            timeseries_panel(
                ids,
                "Requests by how they were served",
                "Requests per second of routers in PD mode: disaggregated (a prefill/decode "
                "pair), colocated (the uncached prompt was under the threshold), no_prefill (no "
                "healthy pair: a colocated worker took it).",
                "reqps",
                target(f"sum by (how) (rate(tpuserve_router_pd_requests_total[{RI}]))", "{{how}}"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Failed legs by leg and kind",
                "Failed legs of pairs per second, by the leg blamed (a decode that never got its "
                "KV blames the prefill) and kind: bootstrap, transfer, transport, status, timeout. "
                "Each is retried on a new pair while the retry budget allows.",
                "ops",
                target(
                    f"sum by (leg, kind) (rate(tpuserve_router_pd_failures_total[{RI}]))",
                    "{{leg}} {{kind}}",
                ),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Engines' bootstrap and transfer failures",
                "Requests per second whose bootstrap or KV transfer failed, as each engine "
                "counts them (SGLang's counters), by engine role.",
                "ops",
                target(
                    f"sum by (engine_type) (rate({sg.NUM_BOOTSTRAP_FAILED_REQS.name}{m}[{RI}]))",
                    "{{engine_type}} bootstrap",
                ),
                target(
                    f"sum by (engine_type) (rate({sg.NUM_TRANSFER_FAILED_REQS.name}{m}[{RI}]))",
                    "{{engine_type}} transfer",
                ),
                span=8,
            )
        )
        .with_row(Row("Latency of a pair"))
        .with_panel(
            timeseries_panel(
                ids,
                "Time to first token of pairs",
                "p50 and p99 of the seconds from the router dispatching a pair to the decode's "
                "first chunk: queue, prefill, KV transfer and the first decode step.",
                "s",
                *_quantiles("tpuserve_router_pd_ttft_seconds", "model", ROUTER_MODEL),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Prefill and KV hand-off (router)",
                "p50 and p99 of the prefill leg (dispatch to the prefill's answer, sent once "
                "its KV is) and of its KV hand-off (the prefill's first token to its answer: "
                "bootstrap wait and transfer).",
                "s",
                *(
                    (expr, f"prefill {legend}")
                    for expr, legend in _quantiles("tpuserve_router_pd_prefill_seconds", "")
                ),
                *(
                    (expr, f"KV hand-off {legend}")
                    for expr, legend in _quantiles("tpuserve_router_pd_kv_transfer_seconds", "")
                ),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "KV transfer latency (engines)",
                "p50 and p99 of the milliseconds a KV transfer took, as the engines record it, "
                "by engine role.",
                "ms",
                *_quantiles(sg.KV_TRANSFER_LATENCY_MS.name, "engine_type", MODEL),
                span=8,
            )
        )
        .with_row(Row("Engines by role"))
        .with_panel(
            timeseries_panel(
                ids,
                "TTFT and ITL p99 by role",
                "p99 of time to first token and of inter-token latency over 5 minutes by "
                "engine role (prefill, decode; unified for colocated engines of the model).",
                "s",
                target(
                    f"model_role:sglang_ttft_seconds:p99_5m{m}",
                    "{{model_name}} {{engine_type}} TTFT p99",
                ),
                target(
                    f"model_role:sglang_itl_seconds:p99_5m{m}",
                    "{{model_name}} {{engine_type}} ITL p99",
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "PD queues per engine",
                "Requests in SGLang's PD queues (TP rank 0): a prefill's bootstrap (waiting for "
                "its decode) and inflight (KV being sent) queues, a decode's prealloc (waiting "
                "for KV room) and transfer (waiting for the KV) queues.",
                "short",
                target(
                    f"max by (pod) ({sg.NUM_PREFILL_BOOTSTRAP_QUEUE_REQS.name}{{{rank0}}})",
                    "{{pod}} bootstrap",
                ),
                target(
                    f"max by (pod) ({sg.NUM_PREFILL_INFLIGHT_QUEUE_REQS.name}{{{rank0}}})",
                    "{{pod}} inflight",
                ),
                target(
                    f"max by (pod) ({sg.NUM_DECODE_PREALLOC_QUEUE_REQS.name}{{{rank0}}})",
                    "{{pod}} prealloc",
                ),
                target(
                    f"max by (pod) ({sg.NUM_DECODE_TRANSFER_QUEUE_REQS.name}{{{rank0}}})",
                    "{{pod}} transfer",
                ),
            )
        )
    )
