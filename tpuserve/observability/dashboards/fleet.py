"""Fleet overview: how many tokens per second the fleet serves, per model, per TPU generation and
per chip, at what latency, prefix-hit ratio and cost, built on the recording rules; and the
engines' cold starts (their own two series)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from sglang_tpu import metric_names as sg
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
    return (
        base_dashboard(
            "tpuserve / Fleet overview",
            "tpuserve-fleet-overview",
            "Token throughput of the whole tpuserve fleet: per model, TPU generation and chip, "
            "with latency, prefix-cache hit ratio and cost.",
            model_variable=True,
        )
        .with_row(Row("Fleet now"))
        .with_panel(
            stat_panel(
                ids,
                "Output tokens/s",
                "Tokens the fleet decodes per second (all models), from SGLang's real-time "
                "decode counter on TP rank 0.",
                "tokens/s",
                target("fleet:sglang_decode_tokens:rate1m"),
                span=4,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Input tokens/s",
                "Prompt tokens the fleet takes in per second, cached ones included.",
                "tokens/s",
                target("fleet:sglang_prompt_tokens:rate1m"),
                span=4,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Prefix-cache hit ratio",
                "Share of prompt tokens served from the prefix cache over 5 minutes: "
                "cached_tokens / prompt_tokens from counters (never the cache_hit_rate gauge).",
                "percentunit",
                target("fleet:sglang_prefix_cache_hit:ratio_rate5m"),
                span=4,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Requests/s",
                "Requests the fleet finishes per second.",
                "reqps",
                target("fleet:sglang_requests:rate1m"),
                span=4,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Output tokens/s per chip",
                "Fleet output tokens per second divided by the TPU chips its replicas own.",
                "tokens/s",
                target("fleet:sglang_decode_tokens_per_chip:rate1m"),
                span=4,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "TPU cost",
                "Hourly cost of the chips all replicas own, at the chart's per-generation "
                "chip-hour prices (idle replicas included).",
                "currencyUSD",
                target("fleet:tpuserve_tpu_cost_usd:per_hour"),
                span=4,
            )
        )
        .with_row(Row("Throughput"))
        .with_panel(
            timeseries_panel(
                ids,
                "Output tokens/s by model",
                "Decoded tokens per second per served model, stacked.",
                "tokens/s",
                target(f"model:sglang_decode_tokens:rate1m{m}", "{{model_name}}"),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Input tokens/s by model: computed vs cached",
                "Prompt tokens per second per model, split into tokens the TPUs computed and "
                "tokens served from the prefix cache.",
                "tokens/s",
                target(
                    f"model:sglang_prompt_tokens:rate1m{m} - model:sglang_cached_tokens:rate1m{m}",
                    "{{model_name}} computed",
                ),
                target(f"model:sglang_cached_tokens:rate1m{m}", "{{model_name}} cached"),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Output tokens/s by TPU generation",
                "Decoded tokens per second per TPU generation.",
                "tokens/s",
                target("tpu_generation:sglang_decode_tokens:rate1m", "{{tpu_generation}}"),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Output tokens/s per chip by TPU generation",
                "Decoded tokens per second per TPU chip: how hard each generation works.",
                "tokens/s",
                target("tpu_generation:sglang_decode_tokens_per_chip:rate1m", "{{tpu_generation}}"),
            )
        )
        .with_row(Row("Latency and cache"))
        .with_panel(
            timeseries_panel(
                ids,
                "Time to first token p99 by model",
                "99th percentile of time to first token per model over 5 minutes.",
                "s",
                target(f"model:sglang_ttft_seconds:p99_5m{m}", "{{model_name}}"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "TTFT SLO attainment by model",
                "Share of requests whose first token came within the SLO threshold, over 5 "
                "minutes (the error-budget alerts use the same series).",
                "percentunit",
                target(f"model:sglang_ttft_good:ratio_rate5m{m}", "{{model_name}}"),
                span=8,
                max_value=1,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Prefix-cache hit ratio by model",
                "Share of prompt tokens served from the prefix cache per model over 5 minutes.",
                "percentunit",
                target(f"model:sglang_prefix_cache_hit:ratio_rate5m{m}", "{{model_name}}"),
                span=8,
                max_value=1,
            )
        )
        .with_row(Row("Cost"))
        .with_panel(
            timeseries_panel(
                ids,
                "TPU cost by generation",
                "Hourly cost of the chips replicas own, per TPU generation.",
                "currencyUSD",
                target("tpu_generation:tpuserve_tpu_cost_usd:per_hour", "{{tpu_generation}}"),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Cost per million output tokens by model",
                "US dollars of TPU time per million output tokens per model over the last hour.",
                "currencyUSD",
                target(f"model:tpuserve_cost_usd_per_1m_output_tokens:rate1h{m}", "{{model_name}}"),
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Cost per million tokens",
                "US dollars of TPU time per million tokens (input plus output) over the whole "
                "fleet, over the last hour, at the chart's chip-hour prices.",
                "currencyUSD",
                target("fleet:tpuserve_cost_usd_per_1m_tokens:rate1h"),
                span=6,
            )
        )
        .with_panel(
            stat_panel(
                ids,
                "Tokens per day per chip",
                "Tokens (input plus output) a day per TPU chip the replicas own, at the last "
                "hour's rate: the fleet number capacity plans are stated in.",
                "short",
                target("fleet:tpuserve_tokens_per_day_per_chip:rate1h"),
                span=6,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Tokens per day per chip by model",
                "Tokens (input plus output) a day per TPU chip per served model, at the last "
                "hour's rate.",
                "short",
                target(f"model:tpuserve_tokens_per_day_per_chip:rate1h{m}", "{{model_name}}"),
            )
        )
        .with_row(Row("Cold starts"))
        .with_panel(
            timeseries_panel(
                ids,
                "Cold start by phase",
                "Seconds each phase of an engine's last cold start took (pull, weights, XLA "
                "compile, warmup), per leader pod.",
                "s",
                target(
                    f"max by (namespace, pod, phase) ({sg.COLD_START_SECONDS})",
                    "{{pod}} {{phase}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Compile cache hits and misses",
                "Engine starts over the last hour whose compile cache held their key (hit) or "
                "compiled cold (miss).",
                "short",
                target(f"sum by (result) (increase({sg.COMPILE_CACHE_TOTAL}[1h]))", "{{result}}"),
            )
        )
    )
