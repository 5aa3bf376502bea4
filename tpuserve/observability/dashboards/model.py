"""Model detail: one model's throughput, latency percentiles and SLOs, and its replicas side by
side (load balance, queues, KV-cache pressure, prefix hits)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from tpuserve.observability import rule_basis
from tpuserve.observability.dashboards.common import (
    MODEL,
    Ids,
    base_dashboard,
    stat_panel,
    target,
    timeseries_panel,
)


def build() -> Dashboard:
    ids = Ids()
    m = f"{{{MODEL}}}"
    budget = round(1 - rule_basis.SLO_OBJECTIVE, 6)
    return (
        base_dashboard(
            "tpuserve / Model detail",
            "tpuserve-model-detail",
            "One model: throughput, latency percentiles, SLO attainment and per-replica load.",
            model_variable=True,
        )
        .with_row(Row("Throughput"))
        .with_panel(
            timeseries_panel(
                ids,
                "Tokens/s",
                "Input (prompt), cached input and output (decoded) tokens per second.",
                "tokens/s",
                target(f"model:sglang_prompt_tokens:rate1m{m}", "{{model_name}} input"),
                target(f"model:sglang_cached_tokens:rate1m{m}", "{{model_name}} cached input"),
                target(f"model:sglang_decode_tokens:rate1m{m}", "{{model_name}} output"),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Requests/s and output tokens/s per chip",
                "Finished requests per second, and output tokens per second per TPU chip.",
                "short",
                target(f"model:sglang_requests:rate1m{m}", "{{model_name}} requests/s"),
                target(
                    f"model:sglang_decode_tokens_per_chip:rate1m{m}",
                    "{{model_name}} output tokens/s per chip",
                ),
            )
        )
        .with_row(Row("Latency"))
        .with_panel(
            timeseries_panel(
                ids,
                "Time to first token",
                "p50, p90 and p99 of time to first token over 5 minutes.",
                "s",
                target(f"model:sglang_ttft_seconds:p50_5m{m}", "{{model_name}} p50"),
                target(f"model:sglang_ttft_seconds:p90_5m{m}", "{{model_name}} p90"),
                target(f"model:sglang_ttft_seconds:p99_5m{m}", "{{model_name}} p99"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Inter-token latency",
                "p50 and p99 of the time between streamed tokens over 5 minutes "
                "(token-weighted, as SGLang records it).",
                "s",
                target(f"model:sglang_itl_seconds:p50_5m{m}", "{{model_name}} p50"),
                target(f"model:sglang_itl_seconds:p99_5m{m}", "{{model_name}} p99"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "End-to-end latency and queue time",
                "p50 and p99 of request latency, and p99 of time spent in the scheduler queue.",
                "s",
                target(f"model:sglang_e2e_seconds:p50_5m{m}", "{{model_name}} e2e p50"),
                target(f"model:sglang_e2e_seconds:p99_5m{m}", "{{model_name}} e2e p99"),
                target(f"model:sglang_queue_time_seconds:p99_5m{m}", "{{model_name}} queue p99"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Time to first token by role",
                "p50 and p99 of each engine role's time to first token over 5 minutes: prefill "
                "and decode engines of a disaggregated server (a decode engine's includes its "
                "wait for the prefill and the KV transfer), unified for colocated ones. The "
                "client's TTFT of a pair is on the Prefill/decode dashboard.",
                "s",
                target(
                    f"model_role:sglang_ttft_seconds:p50_5m{m}",
                    "{{model_name}} {{engine_type}} p50",
                ),
                target(
                    f"model_role:sglang_ttft_seconds:p99_5m{m}",
                    "{{model_name}} {{engine_type}} p99",
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Inter-token latency by role",
                "p50 and p99 of the time between streamed tokens by engine role over 5 minutes: "
                "decode engines of a disaggregated server run no prefills beside their decodes "
                "(prefill engines make one token: no gaps), unified ones do.",
                "s",
                target(
                    f"model_role:sglang_itl_seconds:p50_5m{m}", "{{model_name}} {{engine_type}} p50"
                ),
                target(
                    f"model_role:sglang_itl_seconds:p99_5m{m}", "{{model_name}} {{engine_type}} p99"
                ),
            )
        )
        .with_row(Row("SLOs"))
        .with_panel(
            timeseries_panel(
                ids,
                "SLO attainment",
                f"Share of requests with TTFT <= {rule_basis.TTFT_SLO_SECONDS} s and of tokens "
                f"with inter-token latency <= {rule_basis.ITL_SLO_SECONDS} s; objective "
                f"{rule_basis.SLO_OBJECTIVE:.0%}.",
                "percentunit",
                target(f"model:sglang_ttft_good:ratio_rate5m{m}", "{{model_name}} TTFT 5m"),
                target(f"model:sglang_ttft_good:ratio_rate1h{m}", "{{model_name}} TTFT 1h"),
                target(f"model:sglang_itl_good:ratio_rate5m{m}", "{{model_name}} ITL 5m"),
                max_value=1,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "TTFT error-budget burn rate (1 h)",
                "How many times faster than allowed the TTFT error budget burned over the last "
                f"hour; 1 spends it exactly in 30 days, {rule_basis.FAST_BURN_RATE} pages.",
                "x",
                target(
                    f"(1 - model:sglang_ttft_good:ratio_rate1h{m}) / {budget}", "{{model_name}}"
                ),
                span=6,
                height=8,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Cost per million tokens",
                "US dollars of TPU time per million tokens (input plus output) over the last hour.",
                "currencyUSD",
                target(f"model:tpuserve_cost_usd_per_1m_tokens:rate1h{m}", "{{model_name}}"),
                span=6,
                height=8,
            )
        )
        .with_row(Row("Replicas"))
        .with_panel(
            timeseries_panel(
                ids,
                "Output tokens/s per replica",
                "Decoded tokens per second of each replica's leader pod: shows load imbalance.",
                "tokens/s",
                target(f"sum by (pod) (pod:sglang_decode_tokens:rate1m{m})", "{{pod}}"),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Running and queued requests per replica",
                "Requests in the running batch and waiting in the scheduler queue (TP rank 0).",
                "short",
                target(f"max by (pod) (pod:sglang_running_requests:max{m})", "{{pod}} running"),
                target(f"max by (pod) (pod:sglang_queued_requests:max{m})", "{{pod}} queued"),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "KV-cache usage per replica",
                "Share of the KV pool in use; near 1 precedes retractions and queueing.",
                "percentunit",
                target(f"max by (pod) (pod:sglang_kv_usage:ratio{m})", "{{pod}}"),
                max_value=1,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Prefix-cache hit ratio per replica",
                "Share of each replica's prompt tokens served from its prefix cache over 5 "
                "minutes: a prefix-aware router keeps these high.",
                "percentunit",
                target(f"pod:sglang_prefix_cache_hit:ratio_rate5m{m}", "{{pod}}"),
                max_value=1,
            )
        )
        .with_row(Row("Autoscaling signals"))
        .with_panel(
            timeseries_panel(
                ids,
                "Queued prefill tokens per replica",
                "Waiting requests x mean uncached prompt tokens per request over 5 minutes: "
                "what KEDA's backlogSeconds trigger divides by the replica's peak prefill "
                "throughput (the ScaledObject's tpuserve.dev/prefill-tokens-per-second).",
                "short",
                target(f"pod:sglang_queued_prefill_tokens:estimate{m}", "{{pod}}"),
                target(f"model:sglang_queued_prefill_tokens:sum{m}", "{{model_name}} total"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Uncached prompt tokens per request",
                "Prompt tokens per finished request that the prefix cache did not serve, over "
                "5 minutes: the prefill work one waiting request stands for.",
                "short",
                target(f"pod:sglang_uncached_prompt_tokens_per_request:ratio_rate5m{m}", "{{pod}}"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Request rate, its trend 5 minutes ahead, and yesterday",
                "Finished requests/s now; the least-squares trend of the last 10 minutes "
                "evaluated 5 minutes ahead (what a KEDA predictive floor with horizonSeconds "
                "300 and windowSeconds 600 extrapolates); and the rate 23 h 55 min ago, "
                "yesterday's shape one horizon ahead.",
                "reqps",
                target(f"model:sglang_requests:rate1m{m}", "{{model_name}} now"),
                target(
                    f"predict_linear(model:sglang_requests:rate1m{m}[10m], 300)",
                    "{{model_name}} trend +5 min",
                ),
                target(
                    f"model:sglang_requests:rate1m{m} offset 23h55m",
                    "{{model_name}} yesterday +5 min",
                ),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "KV-pool occupancy (kvCacheUsage)",
                "Share of each replica's KV pool in use and the model's mean: KEDA's "
                "kvCacheUsage trigger sums the replicas' shares against its target per replica.",
                "percentunit",
                target(f"pod:sglang_kv_usage:ratio{m}", "{{pod}}"),
                target(f"model:sglang_kv_usage:avg{m}", "{{model_name}} mean"),
                span=8,
                max_value=1,
            )
        )
    )
