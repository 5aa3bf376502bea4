"""A namespace gateway's router (docs/gateway.md): only the models it fronts, and one model's
requests in flight held to its share while another model is still admitted. Engine twins on
loopback, the official openai client."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.component.router.router_fleet import EngineTwin, start_router
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
