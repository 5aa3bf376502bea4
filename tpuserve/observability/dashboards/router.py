"""Router: requests and client-side latency, upstream errors, worker health and load, and how
well prefix-aware routing works (decisions, predicted vs actual cached tokens, KV events).
Series are declared in router/tpuserve_router/metrics.py."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from tpuserve.observability import rule_basis
from tpuserve.observability.dashboards.common import (
    Ids,
    base_dashboard,
    stat_panel,
    target,
    timeseries_panel,
)

RI = "$__rate_interval"


def build() -> Dashboard:
    ids = Ids()
    return (
        base_dashboard(
            "tpuserve / Router",
            "tpuserve-router",
            "The prefix-aware router: traffic, client-side latency, upstream errors, worker "
            "health and routing effectiveness.",
            model_variable=False,
        )
        .with_row(Row("Traffic"))
        .with_panel(
            stat_panel(
                ids,
                "Healthy workers",
                "Model-server leaders the routers currently consider healthy, per model.",
                "short",
                target(f"sum by (model) ({rule_basis.ROUTER_WORKER_HEALTHY})", "{{model}}"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Requests/s by model and status",
                "Requests the routers finished per second, by model and HTTP status.",
                "reqps",
                target(
                    f"sum by (model, status) (rate({rule_basis.ROUTER_REQUESTS}[{RI}]))",
                    "{{model}} {{status}}",
                ),
                span=16,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Time to first token seen by clients",
                "p50 and p99 of time from request arrival at the router to the first streamed "
                "token; minus the engine's TTFT this is what the router adds.",
                "s",
                target(
                    "histogram_quantile(0.5, sum by (le, model) "
                    f"(rate(tpuserve_router_ttft_seconds_bucket[{RI}])))",
                    "{{model}} p50",
                ),
                target(
                    "histogram_quantile(0.99, sum by (le, model) "
                    f"(rate(tpuserve_router_ttft_seconds_bucket[{RI}])))",
                    "{{model}} p99",
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Upstream errors by reason",
                "Errors talking to model servers per second: connect errors, resets, timeouts, "
                "retryable statuses and broken streams.",
                "reqps",
                target(
                    f"sum by (reason) (rate({rule_basis.ROUTER_UPSTREAM_ERRORS}[{RI}]))",
                    "{{reason}}",
                ),
                target(f"sum(rate(tpuserve_router_retries_total[{RI}]))", "retries"),
            )
        )
        .with_row(Row("Workers"))
        .with_panel(
            timeseries_panel(
                ids,
                "In-flight requests per worker",
                "Requests each worker is serving right now, as the routers count them.",
                "short",
                target("sum by (worker) (tpuserve_router_in_flight_requests)", "{{worker}}"),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Output tokens/s per worker (router view)",
                "Completion tokens per second per worker from responses' usage.",
                "tokens/s",
                target(
                    f"sum by (worker) (rate(tpuserve_router_completion_tokens_total[{RI}]))",
                    "{{worker}}",
                ),
            )
        )
        .with_row(Row("Prefix-aware routing"))
        .with_panel(
            timeseries_panel(
                ids,
                "Routing decisions by outcome",
                "Decisions per second by policy and outcome (prefix hit, miss, balanced away).",
                "ops",
                target(
                    "sum by (policy, outcome) "
                    f"(rate(tpuserve_router_routing_decisions_total[{RI}]))",
                    "{{policy}} {{outcome}}",
                ),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Predicted vs actual cached tokens",
                "Prompt tokens the router expected the chosen worker to have cached, and the "
                "tokens the worker reported cached; the gap is routing regret. The predicted "
                "tokens by tier: in HBM, or in an engine's host-memory KV tier (loaded back "
                "before prefill; docs/host-kv-tier.md).",
                "tokens/s",
                target(
                    f"sum(rate(tpuserve_router_predicted_cached_tokens_total[{RI}]))",
                    "predicted",
                ),
                target(f"sum(rate(tpuserve_router_cached_tokens_total[{RI}]))", "actual"),
                target(
                    "sum by (tier) "
                    f"(rate(tpuserve_router_predicted_cached_tokens_by_tier_total[{RI}]))",
                    "predicted in {{tier}}",
                ),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "KV events and gaps",
                "KV events received per second by type, and sequence gaps per second.",
                "ops",
                target(f"sum by (type) (rate(tpuserve_router_kv_events_total[{RI}]))", "{{type}}"),
                target(f"sum(rate({rule_basis.ROUTER_KV_EVENT_GAPS}[{RI}]))", "gaps"),
                span=8,
            )
        )
    )
