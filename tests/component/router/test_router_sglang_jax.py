"""The router in front of SGLang-JAX engines (the twin's ``--flavor sglang-jax``: no
``/v1/loads``, ``/get_load`` 500, no KV events, no ``sglang:*`` metrics): it knows them for
SGLang-JAX (detected, or told by ``--engine-type``), reads their load from
``/get_server_info``'s internal states, routes a repeated prefix by its own record of what it
sent where, and says so in ``GET /workers`` and on ``/metrics``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.component.router.router_fleet import EngineTwin, start_engines, start_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.engine_types import ADAPTERS, SGLANG_JAX

pytestmark = pytest.mark.component

JAX_TWIN = ["--flavor", "sglang-jax", "--time-scale", "0"]
PROMPT = "A long system prompt that several requests share, so a prefix cache can hold it. " * 8


@pytest.fixture(scope="module")
def jax_engines() -> Iterator[list[EngineTwin]]:
    fleet = start_engines(2, JAX_TWIN, kv_events=False)
    yield fleet
    for engine in fleet:
        engine.stop()


async def router_for(engines: list[EngineTwin], **settings: Any) -> RouterApp:
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        health_check_interval_seconds=0.5,
        load_poll_interval_seconds=0.05,
        **settings,
    )
    return await start_router(config, ready_workers=len(engines))


@pytest.fixture
async def router(jax_engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    app = await router_for(jax_engines)  # the default: precise, --engine-type auto
    yield app
    await app.stop()


async def workers_view(app: RouterApp) -> dict[str, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(app.base_url + "/workers") as answer,
    ):
        assert answer.status == 200, await answer.text()
        listing = await answer.json()
    return {w["url"]: w for w in listing["workers"]}


async def router_metrics(app: RouterApp) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(app.base_url + "/metrics") as answer,
    ):
        return await answer.text()


async def test_the_engine_is_what_sglang_jax_serves(jax_engines: list[EngineTwin]) -> None:
    """What the router must do without: the twin answers as SGLang-JAX does."""
    async with aiohttp.ClientSession() as session:
        url = jax_engines[0].url
        async with session.get(url + "/get_load") as answer:
            assert answer.status == 500
        for path in ("/v1/loads", "/server_info"):
            async with session.get(url + path) as answer:
                assert answer.status == 404, path
        async with session.get(url + "/metrics") as answer:
            assert "sglang:" not in await answer.text()
        async with session.get(url + "/get_server_info") as answer:
            state = (await answer.json())["internal_states"][0]
        assert {"waiting_queue_size", "running_batch_size", "available_kv_tokens"} <= set(state)


async def test_detected_as_sglang_jax_with_its_load_from_server_info(
    router: RouterApp, jax_engines: list[EngineTwin]
) -> None:
    async def detected() -> bool:
        view = await workers_view(router)
        return all(view[e.url]["engine_type"] == SGLANG_JAX for e in jax_engines)

    assert await eventually_async(detected, what="both workers detected as SGLang-JAX")
    view = await workers_view(router)
    for engine in jax_engines:
        worker = view[engine.url]
        assert worker["prefix_routing"] == ADAPTERS[SGLANG_JAX].prefix_routing
        assert "approximate" in worker["prefix_routing"]
        assert worker["engine_load"]["running"] == 0
        assert worker["engine_load"]["waiting_uncached_tokens"] is None  # not said: booked
    assert router.kv is not None
    assert not router.kv.subscriptions(jax_engines[0].url)


async def test_a_request_of_another_client_is_seen_in_the_engines_internal_state() -> None:
    """A client beside the router: its request is on the engine, not in the router's counts;
    the router sees it through ``/get_server_info`` (the engine's ``/get_load`` answers 500)."""
    (target,) = start_engines(1, [*JAX_TWIN[:2], "--time-scale", "1"], kv_events=False)
    app = await router_for([target])
    try:
        async with aiohttp.ClientSession() as session:
            body = {"text": PROMPT, "stream": True,
                    "sampling_params": {"max_new_tokens": 20_000, "ignore_eos": True}}  # fmt: skip
            async with session.post(target.url + "/generate", json=body) as stream:
                assert stream.status == 200
                await stream.content.readline()  # it is running

                async def seen() -> bool:
                    worker = app.registry.get(target.url)
                    assert worker is not None
                    return (worker.peer_in_flight, worker.engine_type) == (1, SGLANG_JAX)

                assert await eventually_async(seen, what="the engine's own request in the view")
                text = await router_metrics(app)
                url = target.url
                assert (
                    f'tpuserve_router_worker_engine_requests{{state="running",worker="{url}"}} 1.0'
                    in text
                )
                assert f'tpuserve_router_worker_kv_usage{{worker="{url}"}}' in text
                assert (
                    f'tpuserve_router_worker_engine_info{{engine_type="sglang-jax",worker="{url}"}}'
                    " 1.0" in text
                )
                async with session.get(url + "/get_load") as answer:
                    assert answer.status == 500  # what the router never needed
            async with session.post(url + "/abort_request", json={"abort_all": True}) as done:
                assert done.status == 200
    finally:
        await app.stop()
        target.stop()


async def test_a_repeated_prefix_goes_where_the_router_sent_it(router: RouterApp) -> None:
    """No KV events: the policy's own record of what it sent where keeps a shared prefix on
    the worker that prefilled it, and the engine reports the cached tokens in usage."""
    async with openai.AsyncOpenAI(
        base_url=router.base_url + "/v1", api_key="unused", max_retries=0
    ) as client:
        model = (await client.models.list()).data[0].id
        first = await client.completions.create(model=model, prompt=PROMPT + "one", max_tokens=2)
        assert first.usage is not None
        cached = []
        for tail in ("two", "three", "four"):
            again = await client.completions.create(model=model, prompt=PROMPT + tail, max_tokens=2)
            assert again.usage is not None
            assert again.usage.prompt_tokens_details is not None
            cached.append(again.usage.prompt_tokens_details.cached_tokens)
    assert all(c and c >= first.usage.prompt_tokens // 2 for c in cached), cached
    text = await router_metrics(router)
    assert "tpuserve_router_cached_tokens_total{" in text


async def test_told_sglang_jax_it_never_asks_for_kv_events(
    jax_engines: list[EngineTwin],
) -> None:
    app = await router_for(jax_engines, engine_type=SGLANG_JAX, policy="precise")
    try:
        view = await workers_view(app)
        assert {w["engine_type"] for w in view.values()} == {SGLANG_JAX}
        assert app.kv is not None
        assert not any(app.kv.subscriptions(e.url) for e in jax_engines)

        async def polled() -> bool:
            return all(w["engine_load"] is not None for w in (await workers_view(app)).values())

        assert await eventually_async(polled, what="both engines' load polled")
    finally:
        await app.stop()


async def test_told_sglang_jax_an_sglang_engine_is_a_load_poll_failure_not_a_crash(
    jax_engines: list[EngineTwin], caplog: pytest.LogCaptureFixture
) -> None:
    """An engine whose load answer is not SGLang-JAX's (here an SGLang twin told to be one):
    the poll fails with the field named, logged once; the worker stays routable on this
    router's own counts."""
    (sglang,) = start_engines(1, ["--time-scale", "0"], kv_events=False)
    try:
        app = await router_for([sglang], engine_type=SGLANG_JAX, policy="cache_aware")
        try:
            problem = "internal_states[0].waiting_queue_size is None"
            assert await eventually_async(
                lambda: problem in caplog.text, what="a failed poll logged"
            )
            worker = app.registry.get(sglang.url)
            assert worker is not None
            assert worker.healthy
            assert worker.engine_load is None
        finally:
            await app.stop()
    finally:
        sglang.stop()
