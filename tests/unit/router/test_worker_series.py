"""A worker's error and KV-event series exist at zero from the moment it joins (so
``increase()``/``rate()`` see its first error or gap) and are removed when it leaves."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tpuserve_router.app import apply_discovered, create_router_app
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.workers import WorkerSpec
from tpuserve_router.metrics import (
    KV_EVENT_SKIP_REASONS,
    KV_EVENT_TYPES,
    REPLAY_RESULTS,
    RESYNC_REASONS,
    UPSTREAM_ERROR_REASONS,
)

pytestmark = pytest.mark.unit

WORKER = "http://127.0.0.1:4000"


def kv_series(worker: str) -> list[tuple[str, dict[str, str]]]:
    return [
        *[
            ("tpuserve_router_kv_events_total", {"worker": worker, "type": t})
            for t in KV_EVENT_TYPES
        ],
        ("tpuserve_router_kv_event_gaps_total", {"worker": worker}),
        *[
            ("tpuserve_router_kv_event_resyncs_total", {"worker": worker, "reason": r})
            for r in RESYNC_REASONS
        ],
        *[
            ("tpuserve_router_kv_event_replays_total", {"worker": worker, "result": r})
            for r in REPLAY_RESULTS
        ],
        ("tpuserve_router_kv_event_lag_batches", {"worker": worker}),
        *[
            ("tpuserve_router_kv_events_skipped_total", {"worker": worker, "reason": r})
            for r in KV_EVENT_SKIP_REASONS
        ],
    ]


def error_series(worker: str) -> list[tuple[str, dict[str, str]]]:
    return [
        ("tpuserve_router_upstream_errors_total", {"worker": worker, "reason": r})
        for r in UPSTREAM_ERROR_REASONS
    ]


def values(registry: CollectorRegistry, series: list[tuple[str, dict[str, str]]]) -> set[object]:
    return {registry.get_sample_value(name, labels) for name, labels in series}


async def test_error_series_appear_at_zero_on_join_and_go_on_leave() -> None:
    registry = CollectorRegistry()
    app = create_router_app(RouterConfig(kv_events=False), registry=registry)
    apply_discovered(app.registry, [WorkerSpec(WORKER)])
    assert values(registry, error_series(WORKER)) == {0.0}
    assert values(registry, kv_series(WORKER)) == {None}  # no KV events subscribed
    app.metrics.upstream_errors.labels(WORKER, "connect_error").inc()
    assert registry.get_sample_value(
        "tpuserve_router_upstream_errors_total", {"worker": WORKER, "reason": "connect_error"}
    ) == 1.0  # fmt: skip
    apply_discovered(app.registry, [])
    assert values(registry, error_series(WORKER)) == {None}


async def test_with_kv_events_every_kv_series_of_a_worker_starts_at_zero() -> None:
    registry = CollectorRegistry()
    app = create_router_app(RouterConfig(policy="precise", kv_events=True), registry=registry)
    try:
        apply_discovered(app.registry, [WorkerSpec(WORKER), WorkerSpec("http://127.0.0.1:4001")])
        assert values(registry, kv_series(WORKER) + error_series(WORKER)) == {0.0}
        apply_discovered(app.registry, [WorkerSpec("http://127.0.0.1:4001")])
        assert values(registry, kv_series(WORKER)) == {None}
        assert values(registry, kv_series("http://127.0.0.1:4001")) == {0.0}
    finally:
        await app.stop()


@pytest.mark.parametrize(
    ("config", "subscribed"),
    [
        (RouterConfig(), True),  # the default policy, precise, uses KV events
        (RouterConfig(policy="cost"), True),
        (RouterConfig(policy="cache_aware"), False),
        (RouterConfig(policy="precise", kv_events=False), False),
    ],
    ids=["default", "cost", "cache_aware", "precise-no-kv-events"],
)
async def test_kv_events_are_subscribed_when_the_policy_uses_them(
    config: RouterConfig, subscribed: bool
) -> None:
    registry = CollectorRegistry()
    app = create_router_app(config, registry=registry)
    try:
        assert (app.kv is not None) is subscribed
        # a routing decision first takes the KV streams' due read (zmtp.SubscriberGroup)
        hook = app.pipeline.before_decision
        assert hook == (app.kv.readers.read_if_due if app.kv is not None else None)
        apply_discovered(app.registry, [WorkerSpec(WORKER)])
        assert values(registry, kv_series(WORKER)) == ({0.0} if subscribed else {None})
    finally:
        await app.stop()
