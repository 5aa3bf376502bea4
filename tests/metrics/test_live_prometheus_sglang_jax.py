"""Live proof for SGLang-JAX replicas: a real Prometheus (Debian's) scrapes engine twins in
SGLang-JAX's flavour (``tpuserve engine sim --flavor sglang-jax``: no ``sglang:*`` series at
all, its /metrics as the real engine's), the router in front of them and the replica series
the operator would export, while traffic goes through the router. Every recording rule and
fleet, model, router and TPU panel query that reads ``sglang:`` series when the engine is
SGLang returns data here too, from the router's own per-worker series (the rules' fallback,
`rule_basis.at_engine_pods`), except the two SGLang histograms the router cannot see
(`NOT_SEEN_BY_THE_ROUTER`: inter-token latency and queue time), which are asserted to be the
only ones left empty."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import openai
import pytest

from sglang_tpu import metric_names as sg
from tests.chart.chart_helpers import find_tool
from tests.component.router.router_fleet import EngineTwin, start_engines, start_router
from tests.metrics.test_live_prometheus import (
    LIVE_DASHBOARDS,
    get_json,
    query,
    reads_sglang,
    wait_for_data,
)
from tests.panel_queries import panel_queries
from tpuserve.cluster.ports import free_port
from tpuserve.observability import catalog, local_prometheus, rules
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

NOT_SEEN_BY_THE_ROUTER = frozenset(
    f"{spec.name}{suffix}"
    for spec in (sg.INTER_TOKEN_LATENCY, sg.QUEUE_TIME)
    for suffix in ("_bucket", "_count", "_sum")
)
"""SGLang histograms with no router counterpart: the router sees a stream's chunks, not the
engine's tokens and steps, and never the engine's queue (docs/observability.md)."""
PREFIX = "Every request of this traffic shares this long system prompt, page after page. " * 6


def names_read(expr: str) -> set[str]:
    """Metric names an expression selects, through recording rules."""
    recorded = {r.record: r.expr for r in rules.recording_rules()}
    pending, seen = set(catalog.selected_names(expr)), set[str]()
    while pending:
        name = pending.pop()
        seen.add(name)
        if name in recorded:
            pending |= catalog.selected_names(recorded[name]) - seen
    return seen


def only_the_engine_sees(expr: str) -> bool:
    """Whether every SGLang series the expression reads is one the router cannot stand in for
    (an ITL or queue-time quantile or ratio)."""
    read = {n for n in names_read(expr) if n.startswith("sglang:")}
    return bool(read) and read <= NOT_SEEN_BY_THE_ROUTER


@dataclass
class JaxFleet:
    router: RouterApp
    engines: list[EngineTwin]


@pytest.fixture
def jax_twins() -> Iterator[list[EngineTwin]]:
    twins = start_engines(2, ["--flavor", "sglang-jax", "--time-scale", "0"], kv_events=False)
    yield twins
    for twin in twins:
        twin.stop()


@pytest.fixture
async def jax_fleet(jax_twins: list[EngineTwin]) -> AsyncIterator[JaxFleet]:
    config = RouterConfig(
        workers=tuple(t.url for t in jax_twins),
        health_check_interval_seconds=0.5,
        load_poll_interval_seconds=0.1,
    )
    router = await start_router(config, ready_workers=len(jax_twins))
    yield JaxFleet(router, jax_twins)
    await router.stop()


class Traffic:
    """Every few rounds of waiting, a plain and a streamed completion sharing a prefix through
    the router (the second is a prefix hit), so every rate and histogram moves."""

    EVERY = 3

    def __init__(self, router: RouterApp, model: str) -> None:
        self.router = router
        self.model = model
        self.rounds = 0

    async def __call__(self) -> None:
        self.rounds += 1
        if self.rounds % self.EVERY != 1:
            return
        async with openai.AsyncOpenAI(
            base_url=self.router.base_url + "/v1", api_key="unused", max_retries=0
        ) as client:
            done = await client.completions.create(
                model=self.model, prompt=f"{PREFIX} question {self.rounds}", max_tokens=8
            )
            assert done.choices
            stream = await client.completions.create(
                model=self.model, prompt=f"{PREFIX} other {self.rounds}", max_tokens=8,
                stream=True,
            )  # fmt: skip
            async for _ in stream:
                pass


async def test_sglang_jax_replicas_fill_every_panel_an_sglang_replica_fills(
    jax_fleet: JaxFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{find_tool('prometheus').parent}:{os.environ.get('PATH', '')}")
    engines = await local_prometheus.describe_engines([e.url for e in jax_fleet.engines])
    exporter = local_prometheus.ReplicaExporter(engines)
    targets = [
        *local_prometheus.fleet_targets(engines, jax_fleet.router.base_url),
        local_prometheus.ScrapeTarget(
            local_prometheus.REPLICAS_JOB, await exporter.start() + "/metrics", honor_labels=True
        ),
    ]
    prometheus = await local_prometheus.start(targets, free_port())
    prometheus.exporter = exporter
    try:
        sglang_rules = [r for r in rules.recording_rules() if reads_sglang(r.expr)]
        panels = {k: e for k, e in panel_queries(LIVE_DASHBOARDS).items() if reads_sglang(e)}
        everything = {f"rule {r.record}": r.record for r in sglang_rules} | panels
        left_empty = {k for k, e in everything.items() if only_the_engine_sees(e)}
        expressions = {k: e for k, e in everything.items() if k not in left_empty}
        assert len(expressions) >= 40, sorted(expressions)
        model = engines[0].model_name
        await wait_for_data(prometheus.url, expressions, Traffic(jax_fleet.router, model))

        # No SGLang series was scraped: the data came from the router's fallback.
        scraped = set(get_json(prometheus.url + "/api/v1/label/__name__/values")["data"])
        assert not {n for n in scraped if n.startswith(("sglang:", "sglang_"))}
        engines_up = query(prometheus.url, f'up{{job="{local_prometheus.MODEL_SERVER_JOB}"}}')
        assert sorted(float(s["value"][1]) for s in engines_up) == [1.0, 1.0]  # scraped
        # The pod-level series carry the engine pods' labels, as an SGLang replica's do.
        (decode,) = [
            s["metric"] for s in query(prometheus.url, "pod:sglang_decode_tokens:rate1m")
            if s["metric"]["pod"] == engines[0].pod
        ]  # fmt: skip
        assert decode["model_name"] == model
        assert decode["tpu_generation"] == engines[0].tpu_generation
        # What stays empty is exactly the ITL and queue-time quantiles and ratios.
        for key in left_empty:
            assert not query(prometheus.url, everything[key]), key
        assert {k for k in left_empty if k.startswith("rule ")} == {
            f"rule {r.record}"
            for r in sglang_rules
            if r.record.startswith(("model:sglang_itl", "model_role:sglang_itl"))
            or r.record.startswith("model:sglang_queue_time")
        }
    finally:
        await prometheus.stop()
