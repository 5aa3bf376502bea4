"""Through the official openai client: completions and streamed chat pass through with usage,
same-prefix requests stay on one worker under light load, and bad input gets a clear 4xx."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import openai
import pytest

from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    requests_by_worker,
    sample,
    start_router,
)
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

SYSTEM = "You are a meticulous assistant for the tpuserve project. " * 12


def client(app: RouterApp, max_retries: int = openai.DEFAULT_MAX_RETRIES) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=app.base_url + "/v1", api_key="unused", max_retries=max_retries
    )


async def test_completion_passes_through_with_usage(router: RouterApp) -> None:
    async with client(router) as oa:
        first = await oa.completions.create(model=MODEL, prompt=SYSTEM + "one", max_tokens=8)
        again = await oa.completions.create(model=MODEL, prompt=SYSTEM + "one", max_tokens=8)
    assert first.choices[0].text
    assert first.usage is not None
    assert first.usage.completion_tokens == 8
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens  # same worker, warm cache
    assert sample(router, "tpuserve_router_completion_tokens_total", {
        "model": MODEL, "worker": next(iter(requests_by_worker(router)))}) == 16  # fmt: skip


async def test_streamed_chat_arrives_chunk_by_chunk_with_usage(router: RouterApp) -> None:
    async with client(router) as oa:
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 12
    assert sample(router, "tpuserve_router_ttft_seconds_count", {"model": MODEL}) == 1
    assert sample(router, "tpuserve_router_prompt_tokens_total", {
        "model": MODEL, "worker": next(iter(requests_by_worker(router, "/v1/chat/completions")))
    }) == usage.prompt_tokens  # fmt: skip


async def test_sglang_generate_passes_through(router: RouterApp) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"text": SYSTEM, "sampling_params": {"max_new_tokens": 4}}
        async with session.post(router.base_url + "/generate", json=body) as response:
            assert response.status == 200
            data = await response.json()
    assert data["meta_info"]["completion_tokens"] == 4


async def test_models_lists_what_the_workers_serve(router: RouterApp) -> None:
    async with client(router) as oa:
        models = await oa.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_same_prefix_requests_stay_on_one_worker_under_light_load(
    router: RouterApp,
) -> None:
    async with client(router) as oa:
        for i in range(12):
            await oa.completions.create(model=MODEL, prompt=SYSTEM + f"question {i}", max_tokens=2)
    counts = requests_by_worker(router)
    assert len(counts) == 1, counts
    assert sample(router, "tpuserve_router_routing_decisions_total",
                  {"policy": "cache_aware", "outcome": "prefix_hit"}) == 11  # fmt: skip
    assert sample(router, "tpuserve_router_cached_tokens_total", {
        "model": MODEL, "worker": next(iter(counts))}) > 11 * 100  # fmt: skip


async def test_distinct_prefixes_spread_over_workers(router: RouterApp) -> None:
    async with client(router) as oa:
        for i in range(9):
            prompt = f"topic {i}: " + f"{i} " * 300
            await oa.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert len(requests_by_worker(router)) == 3


# ---------------------------------------------------------------- bad input


async def raw_post(
    app: RouterApp, path: str, body: bytes, **headers: str
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(app.base_url + path, data=body, headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_malformed_json_is_400_naming_the_body(router: RouterApp) -> None:
    status, body = await raw_post(router, "/v1/chat/completions", b"{not json",
                                  **{"content-type": "application/json"})  # fmt: skip
    assert status == 400
    assert body["error"]["param"] == "body"
    assert "not valid JSON" in body["error"]["message"]


async def test_wrong_field_types_are_400_naming_the_field(router: RouterApp) -> None:
    not_a_list: Any = "hi"  # messages must be a list; the router answers 400 naming it
    async with client(router, max_retries=0) as oa:
        with pytest.raises(openai.BadRequestError) as err:
            await oa.chat.completions.create(model=MODEL, messages=not_a_list)
        assert "messages" in str(err.value)
    status, body = await raw_post(router, "/v1/completions", b'{"prompt": 5}')
    assert (status, body["error"]["param"]) == (400, "prompt")
    status, body = await raw_post(router, "/v1/completions", b'{"prompt": "x", "stream": "yes"}')
    assert (status, body["error"]["param"]) == (400, "stream")
    status, body = await raw_post(router, "/v1/completions", b"[1, 2]")
    assert (status, body["error"]["param"]) == (400, "body")


async def test_an_engine_rejection_passes_through_as_is(router: RouterApp) -> None:
    async with client(router, max_retries=0) as oa:
        with pytest.raises(openai.BadRequestError):
            await oa.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    assert all(w.in_flight == 0 for w in router.registry.workers)


async def test_oversized_body_is_413(engines: list[EngineTwin]) -> None:
    app = await start_router(
        RouterConfig(workers=tuple(e.url for e in engines), max_request_bytes=4096)
    )
    try:
        status, body = await raw_post(app, "/v1/completions", b'{"prompt": "' + b"x" * 8000 + b'"}')
        assert status == 413
        assert "4096" in body["error"]["message"]
        async with client(app, max_retries=0) as oa:
            with pytest.raises(openai.APIStatusError) as err:
                await oa.completions.create(model=MODEL, prompt="y" * 5000, max_tokens=1)
            assert err.value.status_code == 413
    finally:
        await app.stop()


async def test_unknown_model_is_404_listing_the_served_ones(router: RouterApp) -> None:
    async with client(router, max_retries=0) as oa:
        with pytest.raises(openai.NotFoundError) as err:
            await oa.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert MODEL in str(err.value)


async def test_no_healthy_worker_is_503_with_retry_after() -> None:
    app = await start_router(RouterConfig(workers=("http://127.0.0.1:9",)))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                app.base_url + "/v1/completions", json={"prompt": "x"}
            ) as response:
                assert response.status == 503
                assert response.headers["Retry-After"] == "1"
                assert (await response.json())["error"]["type"] == "service_unavailable"
            async with session.get(app.base_url + "/readiness") as response:
                assert response.status == 503
            async with session.get(app.base_url + "/health") as response:
                assert response.status == 200
    finally:
        await app.stop()


async def test_unknown_paths_and_methods_are_404_and_405(router: RouterApp) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.base_url + "/nope") as response:
            assert response.status == 404
        async with session.get(router.base_url + "/v1/completions") as response:
            assert response.status == 405
            assert response.headers["Allow"] == "POST"


async def test_no_client_input_ever_gets_a_500(router: RouterApp) -> None:
    bodies = [b"", b"null", b'{"model": 3}', b'{"messages": []}', b'{"messages": [1]}',
              b'{"prompt": [1, "a"]}', b'{"prompt": null}', b"\xff\xfe", b'{"prompt": {}}',
              b'{"text": "a", "input_ids": [1]}', b'{"input_ids": [[1], "a"]}']  # fmt: skip
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        for body in bodies:
            status, _ = await raw_post(router, path, body)
            assert 400 <= status < 500, (path, body, status)
    assert all(w.in_flight == 0 for w in router.registry.workers)


async def test_pipelined_requests_are_answered_in_order(router: RouterApp) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    request = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    writer.write(request * 3 + b"GET /nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    statuses = re.findall(rb"HTTP/1.1 (\d+)", data)
    assert statuses == [b"200", b"200", b"200", b"404"]
