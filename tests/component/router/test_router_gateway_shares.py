"""A namespace gateway's router (docs/gateway.md): only the models it fronts, and one model's
requests in flight held to its share while another model is still admitted. Engine twins on
loopback, the official openai client."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import openai
import pytest

from tests.component.router.router_fleet import EngineTwin, start_router
from tests.waiting import eventually_async
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

LLAMA, QWEN, GEMMA = "llama", "qwen", "gemma"
SHARE = 2


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EngineTwin]]:
    fleet = [
        EngineTwin(["--served-model-name", name], kv_events=False) for name in (LLAMA, QWEN, GEMMA)
    ]
    try:
        for engine in fleet:
            engine.start()
        yield fleet
    finally:
        for engine in fleet:
            engine.stop()


async def test_a_model_at_its_share_is_shed_while_others_are_served_and_unlisted_ones_404(
    engines: list[EngineTwin],
) -> None:
    workers = tuple(
        f"{name}={e.url}" for name, e in zip((LLAMA, QWEN, GEMMA), engines, strict=True)
    )
    config = RouterConfig(
        workers=workers,
        hold_models=(LLAMA, QWEN),
        hold_models_only=True,
        max_in_flight_per_model=SHARE,
        health_check_interval_seconds=0.2,
    )
    app = await start_router(config, ready_workers=3)
    oa = openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="unused", max_retries=0)
    streams = []
    try:
        with pytest.raises(openai.NotFoundError) as unlisted:  # served, but not fronted
            await oa.completions.create(model=GEMMA, prompt="hi", max_tokens=2)
        assert "available: llama, qwen" in str(unlisted.value)
        for _ in range(SHARE):  # llama's share in flight: streams left open
            stream = await oa.completions.create(
                model=LLAMA, prompt="a long one", max_tokens=4000, stream=True
            )
            await stream.__anext__()
            streams.append(stream)
        with pytest.raises(openai.RateLimitError, match="--max-in-flight-per-model") as shed:
            await oa.completions.create(model=LLAMA, prompt="one more", max_tokens=2)
        assert shed.value.response.headers.get("retry-after")
        answer = await oa.completions.create(model=QWEN, prompt="another model", max_tokens=2)
        assert answer.choices[0].text
    finally:
        for stream in streams:
            await stream.close()
        await oa.close()
        await app.stop()


async def test_a_request_past_its_models_share_is_refused_before_the_rest_of_its_body_is_read(
    engines: list[EngineTwin],
) -> None:
    """A flood past a model's share is refused in the thousands a second, so the 429 comes
    before the prompt is measured, validated or tokenized: at its share, a prompt past
    --max-prompt-chars gets 429 with Retry-After, not its 413; a malformed model still gets
    its 400 (the model must be read to know its share), another model's long prompt its 413,
    and the long prompt its 413 again once the share has room."""
    workers = tuple(f"{name}={e.url}" for name, e in zip((LLAMA, QWEN), engines, strict=False))
    config = RouterConfig(
        workers=workers,
        hold_models=(LLAMA, QWEN),
        hold_models_only=True,
        max_in_flight_per_model=SHARE,
        max_prompt_chars=64,
        health_check_interval_seconds=0.2,
    )
    app = await start_router(config, ready_workers=2)
    oa = openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="unused", max_retries=0)
    long_prompt = "a prompt past the router's limit " * 4
    streams = []
    try:
        for _ in range(SHARE):
            stream = await oa.completions.create(
                model=LLAMA, prompt="a long one", max_tokens=4000, stream=True
            )
            await stream.__anext__()
            streams.append(stream)
        with pytest.raises(openai.RateLimitError, match="--max-in-flight-per-model") as shed:
            await oa.completions.create(model=LLAMA, prompt=long_prompt, max_tokens=2)
        assert shed.value.response.headers.get("retry-after") == "1"
        with pytest.raises(openai.BadRequestError, match="model must be a string"):
            await oa.completions.create(model=LLAMA, prompt="hi", extra_body={"model": 7})
        with pytest.raises(openai.APIStatusError, match="--max-prompt-chars") as other:
            await oa.completions.create(model=QWEN, prompt=long_prompt, max_tokens=2)
        assert other.value.status_code == 413
        async with aiohttp.ClientSession() as http, http.get(app.base_url + "/metrics") as got:
            text = await got.text()
        refused = [
            line
            for line in text.splitlines()
            if line.startswith("tpuserve_router_requests_total{")
            and f'model="{LLAMA}"' in line
            and 'status="429"' in line
        ]
        assert refused, "the share's 429 is counted on its model"
        assert float(refused[0].rsplit(" ", 1)[1]) >= 1
    finally:
        for stream in streams:
            await stream.close()
    try:
        await eventually_async(
            lambda: app.pipeline.flights.of(LLAMA) == 0 or None,
            what=f"{LLAMA}'s streams out of flight",
            timeout_seconds=30,
        )
        with pytest.raises(openai.APIStatusError, match="--max-prompt-chars") as own:
            await oa.completions.create(model=LLAMA, prompt=long_prompt, max_tokens=2)
        assert own.value.status_code == 413
    finally:
        await oa.close()
        await app.stop()
