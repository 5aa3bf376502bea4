"""Router series: each declared once, exposed in valid Prometheus text, removable per worker."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import VirtualClock, fake_request, fake_worker
from tpuserve_router.metrics import (
    StateCollector,
    WorkerState,
    create_router_metrics,
    remove_worker_series,
)
from tpuserve_router.policies import make_policy
from tpuserve_router.policies.precise import PrecisePolicy

pytestmark = pytest.mark.unit

EXPECTED = {
    "tpuserve_router_info": "gauge",
    "tpuserve_router_held_requests": "gauge",
    "tpuserve_router_hold_seconds": "histogram",
    "tpuserve_router_hold_outcomes": "counter",
    "tpuserve_router_demand_signals": "counter",
    "tpuserve_router_requests": "counter",
    "tpuserve_router_ttft_seconds": "histogram",
    "tpuserve_router_e2e_latency_seconds": "histogram",
    "tpuserve_router_prompt_tokens": "counter",
    "tpuserve_router_completion_tokens": "counter",
    "tpuserve_router_cached_tokens": "counter",
    "tpuserve_router_predicted_cached_tokens": "counter",
    "tpuserve_router_routing_decisions": "counter",
    "tpuserve_router_prefix_match_ratio": "histogram",
    "tpuserve_router_retries": "counter",
    "tpuserve_router_retries_over_budget": "counter",
    "tpuserve_router_worker_ejections": "counter",
    "tpuserve_router_upstream_aborts": "counter",
    "tpuserve_router_tenant_requests": "counter",
    "tpuserve_router_tenant_tokens": "counter",
    "tpuserve_router_rate_limited": "counter",
    "tpuserve_router_shed": "counter",
    "tpuserve_router_auth_failures": "counter",
    "tpuserve_router_api_key_reloads": "counter",
    "tpuserve_router_api_keys": "gauge",
    "tpuserve_router_upstream_errors": "counter",
    "tpuserve_router_kv_events": "counter",
    "tpuserve_router_kv_event_gaps": "counter",
    "tpuserve_router_kv_event_resyncs": "counter",
    "tpuserve_router_kv_event_replays": "counter",
    "tpuserve_router_kv_event_lag_batches": "gauge",
    "tpuserve_router_kv_events_skipped": "counter",
    "tpuserve_router_worker_changes": "counter",
    "tpuserve_router_connections_closed": "counter",
    "tpuserve_router_picker_streams_refused": "counter",
    "tpuserve_router_picker_connections_refused": "counter",
    "tpuserve_router_client_connections": "gauge",
    "tpuserve_router_buffered_request_bytes": "gauge",
    "tpuserve_router_in_flight_requests": "gauge",
    "tpuserve_router_worker_healthy": "gauge",
    "tpuserve_router_worker_engine_requests": "gauge",
    "tpuserve_router_worker_kv_usage": "gauge",
    "tpuserve_router_worker_engine_info": "gauge",
    "tpuserve_router_prefix_index_size": "gauge",
    "tpuserve_router_peers": "gauge",
    "tpuserve_router_peer_messages": "counter",
    "tpuserve_router_pd_requests": "counter",
    "tpuserve_router_stream_migrations": "counter",
    "tpuserve_router_pd_failures": "counter",
    "tpuserve_router_pd_ttft_seconds": "histogram",
    "tpuserve_router_pd_prefill_seconds": "histogram",
    "tpuserve_router_pd_kv_transfer_seconds": "histogram",
    "tpuserve_router_predicted_cached_tokens_by_tier": "counter",
    "tpuserve_router_failover_routes": "counter",
}


def scrape(registry: CollectorRegistry) -> dict[str, Metric]:
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_series_is_declared_with_its_type() -> None:
    registry = CollectorRegistry()
    create_router_metrics(registry)
    registry.register(StateCollector(lambda: [], dict))
    families = scrape(registry)
    assert {name: f.type for name, f in families.items()} == EXPECTED


def test_values_and_histograms_are_exposed_exactly() -> None:
    registry = CollectorRegistry()
    metrics = create_router_metrics(registry)
    metrics.requests.labels("m", "w", "/v1/completions", "200").inc()
    metrics.requests.labels("m", "w", "/v1/completions", "200").inc(2)
    ttft = metrics.ttft.labels("m")
    for value in (0.001, 0.005, 0.2, 100.0):
        ttft.observe(value)
    assert registry.get_sample_value("tpuserve_router_requests_total", {
        "model": "m", "worker": "w", "route": "/v1/completions", "status": "200"}) == 3  # fmt: skip
    buckets = {
        s.labels["le"]: s.value
        for s in scrape(registry)["tpuserve_router_ttft_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert buckets["0.005"] == 2  # le: a value equal to a bound counts in that bucket
    assert buckets["0.25"] == 3
    assert buckets["60.0"] == 3
    assert buckets["+Inf"] == 4
    assert registry.get_sample_value("tpuserve_router_ttft_seconds_sum", {"model": "m"}) == (
        pytest.approx(100.206))  # fmt: skip


def test_state_gauges_are_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    states = [WorkerState("http://a:1", ("m",), True, 3), WorkerState("http://b:1", (), False, 0)]
    registry.register(StateCollector(lambda: states, lambda: {"tree_chars": 42}))
    assert (
        registry.get_sample_value("tpuserve_router_in_flight_requests", {"worker": "http://a:1"})
        == 3
    )
    assert registry.get_sample_value(
        "tpuserve_router_worker_healthy", {"model": "", "worker": "http://b:1"}) == 0  # fmt: skip
    assert (
        registry.get_sample_value("tpuserve_router_prefix_index_size", {"kind": "tree_chars"}) == 42
    )


def test_the_policys_failover_routes_and_state_sizes_are_exported() -> None:
    """A worker that left: its blocks' keys are remembered (``..._prefix_index_size{kind=
    "successor_keys"}``) and its conversation's next turn goes to its successor
    (``tpuserve_router_failover_routes_total{kind="successor"}``), read at scrape time."""
    policy = make_policy("precise", clock=VirtualClock(), page_size=4)
    assert isinstance(policy, PrecisePolicy)
    tokens = list(range(32))
    parent = None
    for p in range(8):
        policy.block_index.store("http://a:1", [p + 1], parent, tokens[p * 4 : p * 4 + 4], 4)
        parent = p + 1
    registry = CollectorRegistry()
    registry.register(
        StateCollector(lambda: [], policy.index_sizes, failover_routes=policy.failover_routes)
    )
    routes = {"kind": "successor"}
    assert registry.get_sample_value("tpuserve_router_failover_routes_total", routes) == 0
    policy.on_workers_changed(["http://b:1", "http://c:1"])  # a left
    workers = [fake_worker("http://b:1"), fake_worker("http://c:1")]
    policy.choose(fake_request(token_ids=[*tokens, 99, 98, 97, 96]), workers)
    assert registry.get_sample_value("tpuserve_router_failover_routes_total", routes) == 1
    assert registry.get_sample_value(
        "tpuserve_router_prefix_index_size", {"kind": "successor_keys"}) == 8  # fmt: skip


def test_a_departed_workers_series_are_removed() -> None:
    registry = CollectorRegistry()
    metrics = create_router_metrics(registry)
    metrics.prompt_tokens.labels("m", "gone").inc(5)
    metrics.prompt_tokens.labels("m", "stays").inc(5)
    metrics.kv_events.labels("gone", "BlockStored").inc()
    remove_worker_series(metrics, "gone")
    assert (
        registry.get_sample_value(
            "tpuserve_router_prompt_tokens_total", {"model": "m", "worker": "gone"}
        )
        is None
    )
    assert (
        registry.get_sample_value(
            "tpuserve_router_prompt_tokens_total", {"model": "m", "worker": "stays"}
        )
        == 5
    )
    assert (
        registry.get_sample_value(
            "tpuserve_router_kv_events_total", {"worker": "gone", "type": "BlockStored"}
        )
        is None
    )


def test_a_child_is_made_once_and_a_removed_one_starts_again_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = create_router_metrics(registry)
    first = metrics.requests.labels("m", "w", "/generate", "200")
    assert metrics.requests.labels("m", "w", "/generate", "200") is first
    assert metrics.requests.child(("m", "w", "/generate", "200")) is first
    first.inc()
    remove_worker_series(metrics, "w")
    again = metrics.requests.labels("m", "w", "/generate", "200")
    assert again is not first
    again.inc()
    labels = {"model": "m", "worker": "w", "route": "/generate", "status": "200"}
    assert registry.get_sample_value("tpuserve_router_requests_total", labels) == 1


def test_a_child_with_the_wrong_number_of_labels_is_refused() -> None:
    metrics = create_router_metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="expected labels"):
        metrics.requests.labels("m", "w")
