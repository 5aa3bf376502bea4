"""Gateway: one router in front of many models (a TPUGateway, docs/gateway.md), model by
model: traffic and its statuses (a model shed at its in-flight share shows as its own 429s),
latency, requests held while a model is at zero and how their holds ended, the demand Leases'
renewals. Series are the router's (router/tpuserve_router/metrics.py), each carrying the served
model; a gateway's pods are named `<gateway>-gateway-...`, which the `pod` filter keeps."""

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
GATEWAY_PODS = 'pod=~".+-gateway-.+"'


def build() -> Dashboard:
    ids = Ids()
    on = GATEWAY_PODS
    return (
        base_dashboard(
            "tpuserve / Gateway",
            "tpuserve-gateway",
            "A TPUGateway model by model: traffic, sheds, latency, requests held at zero and "
            "the demand that wakes each model's server.",
            model_variable=False,
        )
        .with_row(Row("Models"))
        .with_panel(
            stat_panel(
                ids,
                "Healthy workers per model",
                "Leaders of each model the gateway's routers consider healthy (0: at zero, or "
                "starting).",
                "short",
                target(f"sum by (model) ({rule_basis.ROUTER_WORKER_HEALTHY}{{{on}}})", "{{model}}"),
                span=8,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Requests/s by model and status",
                "Requests the gateway finished per second, per model and HTTP status: a model "
                "flooded past maxInFlightPerModel shows its own 429s, the others none.",
                "reqps",
                target(
                    f"sum by (model, status) (rate({rule_basis.ROUTER_REQUESTS}{{{on}}}[{RI}]))",
                    "{{model}} {{status}}",
                ),
                span=16,
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "End-to-end latency p99 by model",
                "p99 of the time from a request's arrival at the gateway to its last byte, per "
                "model: one model's flood should leave the others' where it was.",
                "s",
                target(
                    "histogram_quantile(0.99, sum by (le, model) "
                    f"(rate(tpuserve_router_e2e_latency_seconds_bucket{{{on}}}[{RI}])))",
                    "{{model}} p99",
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Time to first token p99 by model",
                "p99 of the time from arrival to the first streamed token, per model (a held "
                "request's includes its wait at zero).",
                "s",
                target(
                    "histogram_quantile(0.99, sum by (le, model) "
                    f"(rate({rule_basis.ROUTER_TTFT}_bucket{{{on}}}[{RI}])))",
                    "{{model}} p99",
                ),
            )
        )
        .with_row(Row("Scale to zero"))
        .with_panel(
            timeseries_panel(
                ids,
                "Requests held per model",
                "Requests waiting in each model's own hold queue (its server at zero or "
                "starting); each model has hold.maxRequests slots and modelShare of the bytes.",
                "short",
                target(f"sum by (model) (tpuserve_router_held_requests{{{on}}})", "{{model}}"),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Holds ended by model and outcome",
                "Held requests per second by how their hold ended: dispatched, queue_full "
                "(the model's slots or share full), preempted, timeout, client_gone, shutdown.",
                "reqps",
                target(
                    "sum by (model, outcome) "
                    f"(rate(tpuserve_router_hold_outcomes_total{{{on}}}[{RI}]))",
                    "{{model}} {{outcome}}",
                ),
            )
        )
        .with_panel(
            timeseries_panel(
                ids,
                "Demand Lease renewals",
                "Writes of the models' demand Leases per second, ok or failed (failed: the "
                "operator cannot see the demand; alert TPUServeDemandSignalFailing).",
                "ops",
                target(
                    f"sum by (result) (rate({rule_basis.ROUTER_DEMAND_SIGNALS}{{{on}}}[{RI}]))",
                    "{{result}}",
                ),
                span=24,
            )
        )
    )
