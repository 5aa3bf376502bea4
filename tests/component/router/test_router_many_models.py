"""Many models behind one router, through the official openai client: twins serving two
models (one with LoRA adapters), requests routed by model and adapter, /v1/models listing
everything, an unknown model 404 in OpenAI's shape, and no label value for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import openai
import pytest

from tests.component.router.router_fleet import (
    EngineTwin,
    requests_by_worker,
    sample,
    start_router,
    wait_ready,
)
from tests.fakes import STUB_MODEL, StubWorker, stub_router
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.admission import Admission
from tpuserve_router.engines.workers import Worker

pytestmark = pytest.mark.component

LLAMA, QWEN = "llama", "qwen"


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EngineTwin]]:
    """llama with adapter sql, llama with sql and chat, qwen without adapters."""
    base = ["--time-scale", "0"]
    fleet = [
        EngineTwin([*base, "--served-model-name", LLAMA, "--lora-paths", "sql=/lora/sql"],
                   kv_events=False),
        EngineTwin([*base, "--served-model-name", LLAMA, "--lora-paths", "sql=/lora/sql",
                    "chat=/lora/chat"], kv_events=False),
        EngineTwin([*base, "--served-model-name", QWEN], kv_events=False),
    ]  # fmt: skip
    try:
        for engine in fleet:
            engine.start()
        yield fleet
    finally:
        for engine in fleet:
            engine.stop()


@pytest.fixture
async def router(engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    """The old `--worker URL` form for the first, `MODEL=URL` for the others."""
    workers = (engines[0].url, f"{LLAMA}={engines[1].url}", f"{QWEN}={engines[2].url}")
    config = RouterConfig(workers=workers, policy="least_load", health_check_interval_seconds=0.2)
    app = await start_router(config, ready_workers=len(engines))
    # read from the twins' /v1/models when admitted; a `MODEL=URL` worker is routable by its
    # given model before that answer comes, so wait_ready alone does not cover it
    await eventually_async(
        lambda: len([w for w in app.registry.workers if w.adapters]) == 2,
        what="the adapters of the two llama engines",
        timeout_seconds=15,
    )
    yield app
    await app.stop()


def client(app: RouterApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="unused", max_retries=0)


async def test_models_lists_every_model_and_adapter(router: RouterApp) -> None:
    async with client(router) as oa:
        models = [m async for m in oa.models.list()]
    assert [m.id for m in models] == [LLAMA, "llama:chat", "llama:sql", QWEN]
    parents = {m.id: (m.model_extra or {}).get("parent") for m in models}
    assert parents == {LLAMA: None, "llama:chat": LLAMA, "llama:sql": LLAMA, QWEN: None}


async def test_one_model_is_retrieved_by_its_id(router: RouterApp) -> None:
    async with client(router) as oa:
        card = await oa.models.retrieve("llama:sql")
        assert (card.id, (card.model_extra or {}).get("parent")) == ("llama:sql", LLAMA)
        assert (await oa.models.retrieve(QWEN)).id == QWEN
        with pytest.raises(openai.NotFoundError) as raised:
            await oa.models.retrieve("gpt-4o")
    error = raised.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found"


async def test_requests_reach_only_workers_of_their_model(
    router: RouterApp, engines: list[EngineTwin]
) -> None:
    async with client(router) as oa:
        for _ in range(6):
            answer = await oa.completions.create(model=QWEN, prompt="hello", max_tokens=2)
            assert answer.model == QWEN
        for _ in range(6):
            await oa.completions.create(model=LLAMA, prompt="hello", max_tokens=2)
    counts = requests_by_worker(router)
    assert counts.pop(engines[2].url) == 6
    assert set(counts) <= {engines[0].url, engines[1].url}
    assert sum(counts.values()) == 6
    assert sample(router, "tpuserve_router_requests_total", {
        "model": QWEN, "worker": engines[2].url, "route": "/v1/completions", "status": "200"
    }) == 6  # fmt: skip


async def test_an_adapter_goes_only_where_it_is_loaded(
    router: RouterApp, engines: list[EngineTwin]
) -> None:
    async with client(router) as oa:
        for _ in range(4):
            await oa.completions.create(model="llama:chat", prompt="hello", max_tokens=2)
    async with aiohttp.ClientSession() as session:
        body = {"text": "hello", "lora_path": "chat", "sampling_params": {"max_new_tokens": 2}}
        async with session.post(router.base_url + "/generate", json=body) as answer:
            assert answer.status == 200
    assert requests_by_worker(router) == {engines[1].url: 4}
    assert requests_by_worker(router, "/generate") == {engines[1].url: 1}
    # an adapter counts under its model: no label value per adapter
    assert sample(router, "tpuserve_router_requests_total", {
        "model": LLAMA, "worker": engines[1].url, "route": "/v1/completions", "status": "200"
    }) == 4  # fmt: skip


async def test_an_unknown_model_is_404_listing_the_served_ones(router: RouterApp) -> None:
    async with client(router) as oa:
        for model in ("gpt-4o", "llama:no-such-adapter", "qwen:sql"):
            with pytest.raises(openai.NotFoundError) as raised:
                await oa.completions.create(model=model, prompt="hello", max_tokens=2)
            error = raised.value.body
            assert isinstance(error, dict)
            assert (error["code"], error["param"]) == ("model_not_found", "model")
            assert error["message"].endswith("available: llama, llama:chat, llama:sql, qwen")
            assert repr(model) in error["message"]
    labels = {
        s.labels["model"]
        for family in router.metrics.registry.collect()
        for s in family.samples
        if "model" in s.labels
    }
    assert labels <= {"", LLAMA, QWEN}  # no label value for what a client made up


async def test_a_worker_added_with_its_model_serves_it(
    router: RouterApp, engines: list[EngineTwin]
) -> None:
    async with aiohttp.ClientSession() as session:
        url = router.base_url + "/workers"
        async with session.delete(url, json={"url": engines[2].url}) as answer:
            assert answer.status == 200
        async with client(router) as oa:
            with pytest.raises(openai.NotFoundError):
                await oa.completions.create(model=QWEN, prompt="hello", max_tokens=2)
        async with session.post(url, json={"url": engines[2].url, "model": 7}) as answer:
            assert answer.status == 400
            assert (await answer.json())["error"]["param"] == "model"
        async with session.post(url, json={"url": engines[2].url, "model": QWEN}) as answer:
            assert answer.status == 200
            assert (await answer.json())["worker"]["models"] == [QWEN]
    await wait_ready(router, len(engines))
    async with client(router) as oa:
        completion = await oa.completions.create(model=QWEN, prompt="hello", max_tokens=2)
    assert completion.model == QWEN


async def test_an_adapter_sticks_to_its_warm_replica(
    router: RouterApp, engines: list[EngineTwin]
) -> None:
    """Both llama twins have sql loaded; least_load alone would pick the first listed on a
    tie, but the replica that served sql lately is preferred while the load stays even."""
    router.pipeline.affinity.routed("sql", engines[1].url)
    async with client(router) as oa:
        for _ in range(5):
            await oa.completions.create(model="llama:sql", prompt="hello", max_tokens=2)
        await oa.completions.create(model=LLAMA, prompt="hello", max_tokens=2)
    assert requests_by_worker(router) == {engines[1].url: 5, engines[0].url: 1}


async def test_a_failing_warm_replica_hands_the_adapter_to_another() -> None:
    failing, healthy = StubWorker("error_500", adapters=("sql",)), StubWorker(adapters=("sql",))
    async with stub_router(failing, healthy) as app, aiohttp.ClientSession() as session:
        await eventually_async(
            lambda: all(w.adapters for w in app.registry.workers), what="adapters listed"
        )
        app.pipeline.affinity.routed("sql", app.registry.workers[0].name)  # warm: the failing
        body = {"model": f"{STUB_MODEL}:sql", "prompt": "hi", "max_tokens": 1}
        async with session.post(app.base_url + "/v1/completions", json=body) as answer:
            assert answer.status == 200  # retried on the other replica, warm or not
    assert (failing.generation_requests, healthy.generation_requests) == (1, 1)


async def test_an_unexpected_error_does_not_end_the_model_refreshes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    learned = 0
    learn = Admission._learn_models

    async def failing_once(self: Admission, worker: Worker) -> None:
        nonlocal learned
        learned += 1
        if learned == 1:
            raise RuntimeError("a bug")
        await learn(self, worker)

    async with stub_router(StubWorker(), models_refresh_seconds=0.01) as app:
        monkeypatch.setattr(Admission, "_learn_models", failing_once)
        await eventually_async(lambda: learned >= 3, what="the refreshes going on")
        assert app.registry.known_models() == [STUB_MODEL]
