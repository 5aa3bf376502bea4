"""Live proof: a real Prometheus (Debian's) scrapes a local fleet under load (`tpuserve up
--prometheus`: engine twins, the router, the fleet's replica series), and EVERY recording rule
and EVERY panel query of the fleet, model, router and TPU dashboards, evaluated through
Prometheus's HTTP API, returns data; every metric they use was scraped from a live /metrics;
every rule evaluates without error. The same holds against a real SGLang 0.5.23 engine for
every rule and panel that reads `sglang:` series: a Prometheus scraping one real engine (and
the replica series the operator would export for its pod) after some traffic.

Series that cannot exist here come from clearly labelled stand-ins (`live_fakes.py`): GKE's TPU
device plugin exporter (no TPU), an overloaded SGLang server (upstream errors, retries) and a
KV-event publisher that loses a batch (gaps). The Operator dashboard and the operator alerts
are proven against the real control plane (tests/e2e/test_observability.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tests import sglang_metrics as sm
from tests.chart.chart_helpers import find_tool, make_renderer
from tests.metrics.live_fakes import FakeTpuDevicePlugin, GappyPublisher, OverloadedWorker
from tests.panel_queries import panel_queries
from tests.real_sglang import RealEngine
from tests.waiting import eventually, eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve.observability import catalog, local_prometheus, rules

pytestmark = pytest.mark.component

DEADLINE_SECONDS = 240.0
PAGE = 16  # the engine twin's default page size, also its KV-event block size
LIVE_DASHBOARDS = (
    "tpuserve-fleet-overview",
    "tpuserve-model-detail",
    "tpuserve-router",
    "tpuserve-tpu-utilisation",
)
PROMPT = "A prompt only the overloaded worker holds, long enough for several pages. " * 6


@dataclass
class Fleet:
    router: str
    prometheus: str
    model: str
    log: Path


def get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_for_up(what: str, check: Callable[[], object], timeout_seconds: float,
                proc: subprocess.Popen[bytes], log: Path) -> None:  # fmt: skip
    """Wait for `check` while `tpuserve up` runs; its log tail says why when it does not."""

    def while_running() -> object:
        assert proc.poll() is None, f"tpuserve up exited while waiting for {what}"
        return check()

    eventually(
        while_running,
        what=what,
        timeout_seconds=timeout_seconds,
        interval_seconds=0.2,
        context=lambda: log.read_text(errors="replace")[-3000:],
        ignore=(OSError,),
    )


@pytest.fixture
def device_plugin() -> Iterator[FakeTpuDevicePlugin]:
    plugin = FakeTpuDevicePlugin()
    plugin.start()
    yield plugin
    plugin.stop()


@pytest.fixture
def fleet(device_plugin: FakeTpuDevicePlugin, tmp_path: Path) -> Iterator[Fleet]:
    tools = find_tool("prometheus").parent
    router_port, prometheus_port = free_port(), free_port()
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "tpuserve", "up", "--workers", "2",
                "--port", str(router_port), "--policy", "precise",
                "--prometheus", "--prometheus-port", str(prometheus_port),
                "--prometheus-target", f"tpu-device-plugin={device_plugin.url}/metrics",
                "--load", "shared-prefix", "--rate", "4", "--duration", "600",
            ],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            env={**os.environ, "PATH": f"{tools}:{os.environ.get('PATH', '')}"},
        )  # fmt: skip
    router, prometheus = f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{prometheus_port}"
    try:
        wait_for_up(
            "the router and Prometheus", lambda: get_json(prometheus + "/api/v1/targets"), 120,
            proc, log,
        )  # fmt: skip
        jobs = {"tpuserve-model-server", "tpuserve-router", "tpuserve-replicas",
                "tpu-device-plugin"}  # fmt: skip

        def all_up() -> bool:  # discovery hands targets to the scrapers after a few seconds
            found = get_json(prometheus + "/api/v1/targets")["data"]["activeTargets"]
            return {t["labels"]["job"] for t in found} == jobs and all(
                t["health"] == "up" for t in found
            )

        wait_for_up("every target up", all_up, 60, proc, log)
        model = get_json(router + "/v1/models")["data"][0]["id"]
        yield Fleet(router, prometheus, model, log)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def inject_router_faults(fleet: Fleet) -> None:
    """An overloaded worker that holds PROMPT's blocks (the router sends PROMPT there, gets 503,
    retries elsewhere), then a lost KV-event batch from it (a gap)."""
    worker = OverloadedWorker(fleet.model)
    publisher = GappyPublisher()
    await worker.start()
    try:
        async with aiohttp.ClientSession() as session:
            body = {"url": worker.url, "kv_events_endpoint": publisher.endpoint}
            async with session.post(fleet.router + "/workers", json=body) as response:
                assert response.status == 200, await response.text()
        await publisher.wait_subscribed()
        tokens = load_tokenizer().encode(PROMPT)
        await publisher.publish_stored(0, tokens, PAGE)
        async with openai.AsyncOpenAI(base_url=fleet.router + "/v1", api_key="x") as client:
            for _ in range(30):  # until the router's index sends PROMPT to the worker
                done = await client.completions.create(
                    model=fleet.model, prompt=PROMPT, max_tokens=2
                )
                assert done.choices  # retried on a healthy worker
                if worker.refused:
                    break
        assert worker.refused, "the router never sent the held prompt to its holder"
        await publisher.publish_stored(2, tokens, PAGE)  # batch 1 is lost
        async with aiohttp.ClientSession() as session:

            async def gap_counted() -> bool:
                async with session.get(fleet.router + "/metrics") as response:
                    lines = (await response.text()).splitlines()
                return any(  # the series exists at 0 from the start; wait for the count
                    line.startswith("tpuserve_router_kv_event_gaps_total{")
                    and not line.endswith(" 0.0")
                    for line in lines
                )

            counted: bool = await eventually_async(
                gap_counted, what="the router to count a KV-event gap"
            )
            assert counted
    finally:
        await worker.stop()
        publisher.close()


def query(prometheus: str, expr: str) -> list[Any]:
    from urllib.parse import urlencode

    answer = get_json(f"{prometheus}/api/v1/query?{urlencode({'query': expr})}")
    assert answer["status"] == "success", (expr, answer)
    result: list[Any] = answer["data"]["result"]
    return result


async def wait_for_data(
    prometheus: str, expressions: dict[str, str], while_waiting: Callable[[], object] = bool
) -> None:
    """Until every expression returns data (`while_waiting` runs at each round), then: every
    rule, recording and alerting, evaluates without error."""
    empty = dict(expressions)

    async def all_have_data() -> bool:
        result = while_waiting()
        if isinstance(result, Awaitable):
            await result
        for key, expr in list(empty.items()):
            if query(prometheus, expr):
                del empty[key]
        return not empty

    await eventually_async(
        all_have_data,
        what="data from every rule and panel query",
        timeout_seconds=DEADLINE_SECONDS,
        interval_seconds=1.0,
        context=lambda: f"still empty: {sorted(empty)}",
    )
    groups = get_json(prometheus + "/api/v1/rules")["data"]["groups"]
    evaluated = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(evaluated) >= {r.record for r in rules.recording_rules()}
    assert set(evaluated) >= {a.alert for a in rules.alerts()}
    broken = {n: r.get("lastError") for n, r in evaluated.items() if r["health"] != "ok"}
    assert not broken


async def test_every_rule_and_panel_query_returns_data_from_a_live_fleet(fleet: Fleet) -> None:
    await inject_router_faults(fleet)
    expressions = {f"rule {r.record}": r.record for r in rules.recording_rules()}
    expressions |= panel_queries(LIVE_DASHBOARDS)
    await wait_for_data(fleet.prometheus, expressions)

    # Every metric a panel or rule selects was scraped from a live /metrics.
    scraped = set(get_json(fleet.prometheus + "/api/v1/label/__name__/values")["data"])
    used: set[str] = set()
    for expr in [
        *panel_queries(LIVE_DASHBOARDS).values(),
        *(r.expr for r in rules.recording_rules()),
    ]:
        used |= catalog.selected_names(expr)
    raw = used - {r.record for r in rules.recording_rules()} - catalog.CHART_CONSTANTS
    raw -= catalog.PROMETHEUS_SERIES
    assert raw <= scraped, sorted(raw - scraped)
    assert {"tensorcore_utilization", "tpuserve_replica_tpu_chips"} <= raw


def test_the_local_rules_are_the_ones_the_chart_renders() -> None:
    from tpuserve.observability import local_prometheus

    objects = make_renderer(find_tool("helm"))()
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    rendered = {g["name"]: g for g in rule["spec"]["groups"]}
    local = local_prometheus.rule_file()
    assert {g["name"]: g for g in local["groups"]} == rendered


def test_bad_prometheus_flags_are_refused_naming_the_flag() -> None:
    up = [sys.executable, "-m", "tpuserve", "up"]
    done = subprocess.run(
        [*up, "--prometheus-target", "plugin:2112"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--prometheus-target 'plugin:2112' is not allowed" in done.stderr
    done = subprocess.run(
        [*up, "--prometheus-port", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert (
        "argument --prometheus-port: '0' is not allowed; allowed: an integer from 1 to 65535"
        in done.stderr
    )


# --- against a real SGLang engine ------------------------------------------------------------


def reads_sglang(expr: str) -> bool:
    """The expression selects an `sglang:` series, directly or through recording rules."""
    recorded = {r.record: r.expr for r in rules.recording_rules()}
    pending, seen = set(catalog.selected_names(expr)), set()
    while pending:
        name = pending.pop()
        seen.add(name)
        if name.startswith(sm.PREFIX):
            return True
        if name in recorded:
            pending |= catalog.selected_names(recorded[name]) - seen
    return False


class Traffic:
    """Every few rounds of waiting, a plain and a streamed request sharing a prefix (the
    second hits the cache): enough for every rate to move, few enough for a CPU engine."""

    EVERY = 5

    def __init__(self, engine: RealEngine) -> None:
        self.engine = engine
        self.rounds = 0

    async def __call__(self) -> None:
        self.rounds += 1
        if self.rounds % self.EVERY != 1:
            return
        prefix = list(range(100, 100 + 3 * self.engine.page_size))
        async with aiohttp.ClientSession() as session:
            for stream in (False, True):
                body = {"input_ids": [*prefix, 16 + self.rounds % 2000, 17], "stream": stream,
                        "sampling_params": {"max_new_tokens": 4, "temperature": 0}}  # fmt: skip
                async with session.post(self.engine.url + "/generate", json=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()


@pytest.mark.real_sglang
async def test_every_sglang_rule_and_panel_returns_data_from_a_real_engine(
    real_engine: RealEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{find_tool('prometheus').parent}:{os.environ.get('PATH', '')}")
    # The engine runs on CPU; it is labelled as the one-chip replica the operator would export
    # it as (`tpuserve_replica_*`, which the per-chip and cost rules divide by).
    engine = local_prometheus.FleetEngine(
        real_engine.url, "real-sglang-0", real_engine.model, "v6e", "1x1", chips=1
    )
    exporter = local_prometheus.ReplicaExporter([engine])
    targets = [
        *local_prometheus.engine_targets([engine]),
        local_prometheus.ScrapeTarget(
            local_prometheus.REPLICAS_JOB, await exporter.start() + "/metrics", honor_labels=True
        ),
    ]
    prometheus = await local_prometheus.start(targets, free_port())
    prometheus.exporter = exporter
    try:
        sglang_rules = [r for r in rules.recording_rules() if reads_sglang(r.expr)]
        panels = {k: e for k, e in panel_queries(LIVE_DASHBOARDS).items() if reads_sglang(e)}
        expressions = {f"rule {r.record}": r.record for r in sglang_rules} | panels
        assert len(sglang_rules) >= 30, [r.record for r in sglang_rules]
        assert len(panels) >= 30, sorted(panels)
        await wait_for_data(prometheus.url, expressions, Traffic(real_engine))
        scraped = set(get_json(prometheus.url + "/api/v1/label/__name__/values")["data"])
        used = set().union(*map(catalog.selected_names, [*(r.expr for r in sglang_rules),
                                                         *panels.values()]))  # fmt: skip
        raw_sglang = {n for n in used if n.startswith(sm.PREFIX)}
        assert raw_sglang <= scraped, sorted(raw_sglang - scraped)
    finally:
        await prometheus.stop()
