"""One driver for every request (issue 69 item 1): each mode (the HTTP port, the HTTP port in
PD mode, the endpoint picker behind an emulated gateway) × each selection (one worker, a
prefill/decode pair) × each way a request ends (complete, the client gone, the engine's stream
broken, refused) runs through the one driver, and the ledger's record of it is checked: the
request counted once on the worker that answered it (or on ``none``), the routing decision
counted (``tpuserve_router_routing_decisions_total``, a pair's included), how a PD-mode request
was served, and every in-flight count back to zero. Real engine twins on loopback; "broken"
kills the answering engine mid-stream (SIGKILL) and starts it again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import aiohttp
import orjson
import pytest

from tests.component.router.gateway_emulator import PickerClient
from tests.component.router.router_fleet import EngineTwin, start_router, wait_ready
from tests.component.router.test_router_pd import LONG, Fleet
from tests.component.router.test_router_pd import fleet as fleet  # the PD twins, shared
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

ROUTE: Final = "/v1/completions"
SHORT: Final = "A short question about TPUs."
ENDINGS: Final = ("complete", "client_gone", "broken", "refused")
CELLS: Final = [
    (mode, selection, ending)
    for mode, selection in (
        ("http", "single"),
        ("picker", "single"),
        ("pd", "single"),
        ("pd", "pair"),
    )
    for ending in ENDINGS
]
"""Every mode with the selections it makes (the picker is refused in PD mode at start; the
HTTP port outside PD mode selects one worker) × every ending."""


@dataclass
class Record:
    """What the ledger shows of the router's requests so far."""

    requests: dict[tuple[str, str], float]
    """(worker, status) -> requests counted on the route."""
    decisions: float
    pd_routes: dict[str, float]
    completion_tokens: dict[str, float]
    """worker -> completion tokens counted."""


def record(app: RouterApp) -> Record:
    requests: dict[tuple[str, str], float] = {}
    decisions = 0.0
    pd_routes: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for family in app.metrics.registry.collect():
        for s in family.samples:
            if s.name == "tpuserve_router_requests_total" and s.labels["route"] == ROUTE:
                key = (s.labels["worker"], s.labels["status"])
                requests[key] = requests.get(key, 0.0) + s.value
            elif s.name == "tpuserve_router_routing_decisions_total":
                decisions += s.value
            elif s.name == "tpuserve_router_pd_requests_total":
                pd_routes[s.labels["how"]] = s.value
            elif s.name == "tpuserve_router_completion_tokens_total":
                worker = s.labels["worker"]
                tokens[worker] = tokens.get(worker, 0.0) + s.value
    return Record(requests, decisions, pd_routes, tokens)


def added(before: Record, after: Record) -> dict[tuple[str, str], float]:
    keys = set(before.requests) | set(after.requests)
    return {
        k: after.requests.get(k, 0.0) - before.requests.get(k, 0.0)
        for k in keys
        if after.requests.get(k, 0.0) != before.requests.get(k, 0.0)
    }


@pytest.fixture
async def routers(fleet: Fleet) -> AsyncIterator[dict[str, RouterApp]]:
    for engine in fleet.engines:  # a cell kills one, and starts it again
        if engine.proc is None or engine.proc.poll() is not None:
            engine.start()
    colocated = RouterConfig(
        workers=(fleet.colocated.url,),
        policy="cache_aware",
        health_check_interval_seconds=0.3,
        health_failure_threshold=2,
        migration_limit=0,  # a broken stream ends broken (migration: test_router_migration)
    )
    apps = {
        "http": await start_router(colocated, ready_workers=1),
        "picker": await start_router(colocated.replace(picker_port=0), ready_workers=1),
        "pd": await start_router(fleet.config(migration_limit=0)),
    }
    try:
        await wait_ready(apps["pd"], len(fleet.engines))
        yield apps
    finally:
        for app in apps.values():
            await app.stop()


def body(selection: str, ending: str) -> dict[str, object]:
    """A streamed completion: a short prompt stays on a colocated worker in PD mode, a long one
    goes to a pair; long enough an answer to be running when its client leaves or its engine
    dies; an invalid one for a refusal (400 at admission)."""
    prompt = LONG if selection == "pair" else SHORT
    tokens = 8 if ending == "complete" else 4000
    if ending == "refused":
        tokens = -1
    return {
        "prompt": f"{ending} {prompt}", "max_tokens": tokens, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip


def answering(app: RouterApp, fleet: Fleet) -> EngineTwin:
    """The engine whose stream the client is reading: the decode with a request in flight,
    else the colocated one."""
    for twin in fleet.decode:
        for worker in app.registry.workers:
            if worker.name == twin.url and worker.in_flight:
                return twin
    return fleet.colocated


async def restart(twin: EngineTwin, apps: dict[str, RouterApp], fleet: Fleet) -> None:
    twin.kill()
    twin.start()
    for name, app in apps.items():
        await wait_ready(app, len(fleet.engines) if name == "pd" else 1, timeout_seconds=30)


async def over_http(
    app: RouterApp, payload: dict[str, object], ending: str, kill: asyncio.Event
) -> str:
    """The request through the router's HTTP port; what the client saw."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(app.base_url + ROUTE, json=payload) as r,
    ):
        if r.status != 200:
            return str(r.status)
        text = b""
        async for line in r.content:
            text += line
            if ending == "client_gone" and line.startswith(b"data: "):
                return "left"  # the connection closes with the session
            if ending == "broken" and line.startswith(b"data: ") and not kill.is_set():
                kill.set()
                await asyncio.sleep(0)
        return "error event" if b'"error"' in text else "done"


async def through_picker(
    app: RouterApp, payload: dict[str, object], ending: str, kill: asyncio.Event
) -> str:
    """The request through the picker and the emulated gateway; what the client saw."""
    assert app.picker is not None
    client = PickerClient(f"127.0.0.1:{app.picker.port}")
    try:
        call, result = await client.open(ROUTE, orjson.dumps(payload))
        if result.immediate is not None:
            call.cancel()
            return str(result.status)
        try:
            async for piece in client.relay(
                call, result, result.endpoints[0], ROUTE, "POST", result.request_body
            ):
                if piece and ending == "client_gone":
                    call.cancel()  # the gateway's client left: Envoy resets the stream
                    return "left"
                if piece and ending == "broken" and not kill.is_set():
                    kill.set()
        except (aiohttp.ClientError, asyncio.CancelledError):
            call.cancel()  # the upstream broke: Envoy resets the stream
            return "broken"
        return "done"
    finally:
        await client.close()


EXPECTED_STATUS: Final = {
    ("complete", False): "200",
    ("client_gone", False): "499",
    ("broken", False): "stream_error",
    ("complete", True): "200",
    ("client_gone", True): "499",
    ("broken", True): "499",  # the gateway relays: the picker sees its stream reset
}
SEEN: Final = {"complete": "done", "client_gone": "left", "broken": "error event"}


@pytest.mark.parametrize(("mode", "selection", "ending"), CELLS)
async def test_every_mode_selection_and_ending_runs_the_one_driver_into_the_ledger(
    fleet: Fleet, routers: dict[str, RouterApp], mode: str, selection: str, ending: str
) -> None:
    app = routers[mode]
    payload = body(selection, ending)
    before = record(app)
    kill = asyncio.Event()
    victim: list[EngineTwin] = []

    async def killer() -> None:
        await kill.wait()
        twin = answering(app, fleet)
        victim.append(twin)
        twin.kill()

    task = asyncio.create_task(killer())
    try:
        send = through_picker if mode == "picker" else over_http
        seen = await asyncio.wait_for(send(app, payload, ending, kill), timeout=60)
    finally:
        task.cancel()
    picker = mode == "picker"
    if ending == "refused":
        assert seen == "400"
        await eventually_async(lambda: bool(added(before, record(app))), what="refusal counted")
        assert added(before, record(app)) == {("none", "400"): 1}
        assert record(app).decisions == before.decisions  # refused before any decision
        assert record(app).pd_routes == before.pd_routes
        return
    if ending == "broken":
        assert victim, "the answering engine was killed mid-stream"
        assert seen == ("broken" if picker else SEEN[ending])
    else:
        assert seen == SEEN[ending]
    expected = EXPECTED_STATUS[(ending, picker)]

    def ended() -> bool:
        return bool(added(before, record(app))) and app.pipeline.in_flight == 0

    await eventually_async(ended, what="the request accounted", timeout_seconds=30)
    counted = added(before, record(app))
    assert len(counted) == 1, counted
    ((worker, status), count) = next(iter(counted.items()))
    assert (status, count) == (expected, 1), counted
    pair = selection == "pair"
    served_by = {d.url for d in fleet.decode} if pair else {fleet.colocated.url}
    assert worker in served_by, (worker, served_by)
    after = record(app)
    assert after.decisions == before.decisions + 1  # a pair's decision counted too
    if mode == "pd":
        how = "disaggregated" if pair else "colocated"
        assert after.pd_routes[how] == before.pd_routes.get(how, 0) + 1
        others = {k: v for k, v in after.pd_routes.items() if k != how}
        assert others == {k: v for k, v in before.pd_routes.items() if k != how}
    await eventually_async(
        lambda: all(w.in_flight == 0 for w in app.registry.workers), what="workers' in flight 0"
    )
    if ending == "complete":  # its tokens counted on the worker that answered
        counted_tokens = after.completion_tokens.get(worker, 0.0)
        assert counted_tokens - before.completion_tokens.get(worker, 0.0) == 8
    if victim:
        await restart(victim[0], routers, fleet)
