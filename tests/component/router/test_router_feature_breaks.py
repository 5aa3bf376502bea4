"""Where two of the router's features meet (issue 56), the breaks a review found, each a test
that failed before its fix: a client hanging up on a disaggregated stream is charged as on a
colocated one (one ledger), and a LoRA request in PD mode goes to workers of the right roles.
The matrix of modes × features is `test_router_feature_matrix`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.component.engine.engine_process import running_requests
from tests.component.router.feature_fleet import (
    ADAPTER,
    MODES,
    PROMPT,
    Fleet,
    client,
    complete,
    keys_file,
    ledger,
    running_fleet,
    series,
    serve,
    settled,
)
from tests.component.router.router_fleet import (
    MODEL,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with running_fleet() as started:
        yield started


@pytest.fixture
async def routers() -> AsyncIterator[list[RouterApp]]:
    """The routers a test starts (`serve`), stopped after it."""
    started: list[RouterApp] = []
    yield started
    for app in started:
        await app.stop()


# ---------------------------------------------------------------- the breaks


async def hang_up(app: RouterApp, fleet: Fleet, mode: str, stream: bool) -> None:
    """A chat request the client leaves: after one chunk of its stream, or while it waits
    for a whole answer the engines are generating."""
    async with client(app) as oa:
        messages: Any = [{"role": "user", "content": PROMPT}]
        if stream:
            answer = await oa.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=100, stream=True
            )
            async for _ in answer:
                break
            await answer.close()
            return

        async def generating() -> bool:
            async with aiohttp.ClientSession() as session:
                engine = fleet.by_model[MODEL]["colocated" if mode == "colocated" else "decode"]
                return await running_requests(session, engine.url) > 0

        whole = asyncio.ensure_future(
            oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=100)
        )
        await eventually_async(generating, what="the engine generating the request")
        whole.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await whole


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_client_hanging_up_on_a_pair_is_charged_as_on_a_colocated_worker(
    fleet: Fleet, routers: list[RouterApp], tmp_path: Path, stream: bool
) -> None:
    """The same hang-up in both modes. The key is charged by the same rule (`Spend.charge`:
    the prompt and the completion it reserved, what its minute holds at least its
    reservation) and the request is counted 499, colocated or disaggregated."""
    found = {}
    for mode in MODES:
        keys = keys_file(tmp_path, tokens_per_minute=5000)
        app = await serve(fleet, routers, mode, api_keys_file=keys, outlier_interval_seconds=3600.0)
        await hang_up(app, fleet, mode, stream)
        await settled(app, fleet, mode)
        found[mode] = ledger(app)
    assert found["colocated"]["prompt"] > 0
    assert found["colocated"]["completion"] == 100  # what it reserved: no usage came
    assert found["colocated"]["tenant requests 499"] == 1
    assert found["colocated"]["outlier window"] == 0
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
    for worker in app.registry.workers:
        if worker.role == "prefill":
            assert series(app, "tpuserve_router_requests_total", worker=worker.name) == 0


async def test_a_lora_request_after_a_pair_stays_colocated_when_short(
    fleet: Fleet, routers: list[RouterApp]
) -> None:
    """Conditional PD with a colocated worker: a long prompt of an adapter goes to a pair (the
    adapter is warm there now), and a short one then goes to the colocated worker, which the
    adapter's warm pair must not hide."""
    colocated = fleet.by_model[MODEL]["colocated"].url
    app = await serve(
        fleet, routers, "pd", workers=(colocated,), pd_policy="conditional",
        pd_threshold_tokens=200,
    )  # fmt: skip
    async with client(app) as oa:
        await complete(oa, f"{MODEL}:{ADAPTER}", prompt=PROMPT * 10)
        await complete(oa, f"{MODEL}:{ADAPTER}", prompt="short")
    assert series(app, "tpuserve_router_pd_requests_total", how="disaggregated") == 1
    assert series(app, "tpuserve_router_pd_requests_total", how="colocated") == 1
    assert series(app, "tpuserve_router_requests_total", worker=colocated, status="200") == 1
