"""A hostile tenant against the hold queue: a `low` key filling it at zero keeps out neither a
`critical` request nor another tenant's share, and at wake-up the held requests leave by class,
tenants taking turns, through the router's in-flight admission (never all at once).

A real router (in the test's loop, so its decisions can be recorded), an engine twin that
starts only at wake-up, and the official `openai` client, on loopback. Before issue 47 the
flooder's requests filled the queue, the `critical` request got 503 `queue_full`, and at
wake-up the flooder's went first, all at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import openai
import orjson
import pytest

from tests.component.router.router_fleet import MODEL, EngineTwin, start_engines, start_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.workers import Worker, WorkerSpec
from tpuserve_router.policies.base import Decision, RouteRequest
from tpuserve_router.tenancy.quotas import in_flight_limits

pytestmark = pytest.mark.component

HOLD = 8
MAX_IN_FLIGHT = 4
KEYS = {
    "batch": ("sk-batch-0123456789abcdef", "low"),
    "small": ("sk-small-0123456789abcdef", "low"),
    "ops": ("sk-ops-0123456789abcdefgh", "critical"),
}


@pytest.fixture
def sleeping_twin() -> Iterator[list[EngineTwin]]:
    """An engine twin started at wake-up (by the test), stopped after it."""
    started: list[EngineTwin] = []
    yield started
    for engine in started:
        engine.stop()


async def held(app: RouterApp, count: int) -> None:
    await eventually_async(lambda: app.pipeline.holds.total == count, what=f"{count} held")


def record_decisions(app: RouterApp, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(prompt, requests in flight at the router) of every routing decision, in order."""
    seen: list[tuple[str, int]] = []
    choose = app.pipeline.policy.choose

    def recording(request: RouteRequest, workers: Sequence[Worker]) -> Decision[Worker]:
        seen.append((request.text or "", app.pipeline.in_flight))
        return choose(request, workers)

    monkeypatch.setattr(app.pipeline.policy, "choose", recording)
    return seen


async def test_a_low_tenant_filling_the_hold_queue_keeps_out_no_critical_request_nor_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeping_twin: list[EngineTwin]
) -> None:
    keys = tmp_path / "keys.json"
    entries = [{"key": k, "tenant": t, "priority": p} for t, (k, p) in KEYS.items()]
    keys.write_bytes(orjson.dumps({"keys": entries}))
    config = RouterConfig(
        policy="cache_aware", api_keys_file=str(keys), hold_max_requests=HOLD,
        hold_models=(MODEL,), max_in_flight=MAX_IN_FLIGHT, health_check_interval_seconds=0.2,
    )  # fmt: skip
    app = await start_router(config)
    decisions = record_decisions(app, monkeypatch)
    clients = {
        tenant: openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key=key, max_retries=0)
        for tenant, (key, _) in KEYS.items()
    }
    sent: dict[str, asyncio.Task[str]] = {}

    async def complete(tenant: str, name: str) -> str:
        try:
            answer = await clients[tenant].completions.create(
                model=MODEL, prompt=name, max_tokens=16
            )
        except openai.APIStatusError as err:
            return str(err.status_code)
        return "200" if answer.choices else "empty"

    async def send(tenant: str, name: str) -> None:
        """Send one request, and wait until the hold queue has taken or refused it."""
        sent[name] = asyncio.ensure_future(complete(tenant, name))
        await eventually_async(lambda: arrivals(app) == len(sent), what=f"{name} held or refused")

    try:
        for i in range(HOLD + 4):  # the flooder fills the queue, then is refused
            await send("batch", f"batch-{i:02d}")
        # the refused four: their 503s may still be on the way when the queue has counted them
        assert [await sent[f"batch-{i:02d}"] for i in range(HOLD, HOLD + 4)] == ["503"] * 4
        assert [sent[f"batch-{i:02d}"].done() for i in range(HOLD)] == [False] * HOLD
        for i in range(2):  # another low tenant takes its share from the flooder's newest
            await send("small", f"small-{i}")
        await send("ops", "ops-critical")  # critical: never refused while low ones wait
        assert not sent["ops-critical"].done()
        preempted = [f"batch-{i:02d}" for i in (7, 6, 5)]
        assert [await sent[name] for name in preempted] == ["503"] * 3
        await held(app, HOLD)

        [engine] = start_engines(1, ["--time-scale", "1"], kv_events=False)  # wake-up
        sleeping_twin.append(engine)
        app.registry.add(WorkerSpec(engine.url))
        answers = await asyncio.gather(*sent.values())
    finally:
        for oa in clients.values():
            await oa.close()
        await app.stop()

    assert answers.count("200") == HOLD
    order = [name for name, _ in decisions]
    assert order == [
        "ops-critical",
        "batch-00", "small-0", "batch-01", "small-1", "batch-02", "batch-03", "batch-04",
    ]  # fmt: skip
    limits = in_flight_limits(MAX_IN_FLIGHT)
    assert decisions[0][1] <= limits["critical"]
    assert all(in_flight <= limits["low"] for _, in_flight in decisions[1:]), decisions


def arrivals(app: RouterApp) -> int:
    """Requests the hold queue took or refused: each is held now or has its outcome."""
    counted = 0.0
    for family in app.metrics.registry.collect():
        if family.name == "tpuserve_router_hold_outcomes":
            counted += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return app.pipeline.holds.total + int(counted)
