"""Where features meet (issue 56): the router's modes crossed with its features, against engine
twins on loopback through the official ``openai`` client.

First the breaks a review found where two features meet, each a test that failed before its
fix: a client hanging up on a disaggregated stream is charged as on a colocated one (one
ledger), and a LoRA request in PD mode goes to workers of the right roles.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest

from tests.component.engine.engine_process import running_requests
from tests.component.router.router_fleet import MODEL, EngineTwin, start_router, wait_ready
from tests.waiting import eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

KEY = "sk-matrix-0123456789abcdef"
ADAPTER = "sql"
PROMPT = "Tell me everything about tensor processing units, their memory and their links. " * 3
MODES = ("colocated", "pd")
"""HTTP colocated (``--worker``) and HTTP PD (``--prefill``/``--decode``, every request a
pair: ``--pd-policy always``)."""


class Fleet:
    """One prefill, one decode and one colocated twin, each serving LoRA adapter `ADAPTER`, at
    half their modelled speed (a stream still runs when its client leaves)."""

    def __init__(self) -> None:
        base = ["--time-scale", "0.5", "--lora-paths", f"{ADAPTER}=/lora/{ADAPTER}"]
        self.bootstrap = free_port()
        self.prefill = EngineTwin(
            [*base, "--disaggregation-mode", "prefill",
             "--disaggregation-bootstrap-port", str(self.bootstrap)],
            kv_events=False,
        )  # fmt: skip
        self.decode = EngineTwin([*base, "--disaggregation-mode", "decode"], kv_events=False)
        self.colocated = EngineTwin(base, kv_events=False)

    @property
    def engines(self) -> list[EngineTwin]:
        return [self.prefill, self.decode, self.colocated]

    def config(self, mode: str, **changes: object) -> RouterConfig:
        if mode == "colocated":
            config = RouterConfig(workers=(self.colocated.url,))
        else:
            config = RouterConfig(
                prefill=(f"{self.prefill.url} {self.bootstrap}",),
                decode=(self.decode.url,),
                pd_policy="always",
            )
        return config.replace(policy="cache_aware", health_check_interval_seconds=0.3, **changes)

    def serving(self, mode: str) -> list[EngineTwin]:
        return [self.colocated] if mode == "colocated" else [self.prefill, self.decode]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet()
    try:
        for engine in fleet.engines:
            engine.start()
        yield fleet
    finally:
        for engine in fleet.engines:
            engine.stop()


@pytest.fixture
async def routers() -> AsyncIterator[list[RouterApp]]:
    """The routers a test starts (`serve`), stopped after it."""
    started: list[RouterApp] = []
    yield started
    for app in started:
        await app.stop()


async def serve(fleet: Fleet, routers: list[RouterApp], mode: str, **changes: object) -> RouterApp:
    app = await start_router(fleet.config(mode, **changes))
    routers.append(app)
    await wait_ready(app, len(fleet.serving(mode)))
    return app


def keys_file(tmp_path: Path, **limits: object) -> str:
    path = tmp_path / "keys.json"
    path.write_bytes(orjson.dumps({"keys": [{"key": KEY, "tenant": "matrix", **limits}]}))
    return str(path)


def client(app: RouterApp, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key=key, max_retries=0)


async def settled(app: RouterApp, fleet: Fleet, mode: str) -> None:
    """Until nothing runs on the router or on the engines it sends to."""

    async def idle() -> bool:
        async with aiohttp.ClientSession() as session:
            for engine in fleet.serving(mode):
                if await running_requests(session, engine.url):
                    return False
        return app.forwarder.in_flight == 0

    await eventually_async(idle, what="the requests ended")


def series(app: RouterApp, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for family in app.metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def ledger(app: RouterApp) -> dict[str, float]:
    """What the router wrote down for the tenant: its tokens, its requests by status, and
    what its key's minute holds."""
    key = app.forwarder.keys.authenticate(KEY.encode()) if app.forwarder.keys else None
    assert key is not None
    window = app.forwarder.quotas.of(key, 0.0).tokens
    assert window is not None
    return {
        "prompt": series(app, "tpuserve_router_tenant_tokens_total", kind="prompt"),
        "completion": series(app, "tpuserve_router_tenant_tokens_total", kind="completion"),
        "requests 499": series(app, "tpuserve_router_requests_total", status="499"),
        "tenant requests 499": series(app, "tpuserve_router_tenant_requests_total", status="499"),
        "minute": float(window.used),
    }


# ---------------------------------------------------------------- the breaks


async def test_a_client_hanging_up_on_a_pair_is_charged_as_on_a_colocated_worker(
    fleet: Fleet, routers: list[RouterApp], tmp_path: Path
) -> None:
    """The same hang-up in both modes: the client reads one chunk of a stream and leaves. The
    key is charged by the same rule (`Spend.charge`: the prompt and the completion it
    reserved, what its minute holds at least its reservation) and the request is counted 499,
    colocated or disaggregated."""
    found = {}
    for mode in MODES:
        app = await serve(
            fleet, routers, mode, api_keys_file=keys_file(tmp_path, tokens_per_minute=5000)
        )
        async with client(app) as oa:
            stream = await oa.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                max_tokens=100, stream=True,
            )  # fmt: skip
            async for _ in stream:
                break
            await stream.close()
        await settled(app, fleet, mode)
        found[mode] = ledger(app)
    assert found["colocated"]["prompt"] > 0
    assert found["colocated"]["completion"] == 100  # what it reserved: no usage came
    assert found["colocated"]["tenant requests 499"] == 1
    assert found["pd"] == found["colocated"]


async def test_a_lora_request_in_pd_mode_goes_to_a_pair(
    fleet: Fleet, routers: list[RouterApp]
) -> None:
    """An adapter's requests in PD mode are served as pairs, as a base model's are: never by
    a prefill or a decode engine alone (which cannot serve them: a decode engine refuses a
    request without a bootstrap room)."""
    app = await serve(fleet, routers, "pd")
    async with client(app) as oa:
        for i in range(4):
            answer = await oa.completions.create(
                model=f"{MODEL}:{ADAPTER}", prompt=f"{i} {PROMPT}", max_tokens=4
            )
            assert answer.choices[0].text
    assert series(app, "tpuserve_router_pd_requests_total", how="disaggregated") == 4
    prefill = next(w for w in app.registry.workers if w.role == "prefill")
    assert series(app, "tpuserve_router_requests_total", worker=prefill.name) == 0
