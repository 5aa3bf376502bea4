"""The official openai client works against `tpuserve engine sim`; bad input gets named 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.component.engine.engine_process import EngineProcess, running_engine

pytestmark = pytest.mark.component

MODEL = "tpuserve/sim-8b"
LONG_PROMPT = (
    "You are a careful assistant. Answer questions about the history of science, giving "
    "dates, names and places, and say when you are not sure about something. Question:"
)


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    with running_engine(
        ["--time-scale", "0", "--served-model-name", MODEL, "--context-length", "4096"]
    ) as proc:
        yield proc


@pytest.fixture
def client(engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)


def test_completion_honours_max_tokens(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7)
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert out.usage.completion_tokens == 7
    assert out.choices[0].text.strip()


def test_streamed_chat_arrives_token_by_token_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert len(pieces) == 5
    assert finish == "length"
    assert usage is not None
    assert usage.completion_tokens == 5


def test_same_prompt_twice_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": LONG_PROMPT + " who measured the speed of light?"}
    ]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert cached > 0
    assert second.choices[0].message.content == first.choices[0].message.content


def test_native_generate_reports_meta_info(engine: EngineProcess) -> None:
    async def go() -> dict[str, object]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                engine.url + "/generate",
                json={"text": LONG_PROMPT, "sampling_params": {"max_new_tokens": 4}},
            ) as r,
        ):
            assert r.status == 200
            body: dict[str, object] = await r.json()
            return body

    body = asyncio.run(go())
    meta = body["meta_info"]
    assert isinstance(meta, dict)
    assert meta["completion_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert {"prompt_tokens", "cached_tokens", "id"} <= meta.keys()


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", b'{"model": "' + MODEL.encode() + b'"}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": 5}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": "9"}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "hi", "model": "other"}', 404, "model"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": [{"role": "x", "content": "a"}]}', 400,
         "messages[0].role"),
        ("/v1/completions", b'{"prompt": "' + b"word " * 5000 + b'"}', 400, "prompt"),
        ("/generate", b'{"sampling_params": {}}', 400, "text"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_4xx_naming_the_field(
    engine: EngineProcess, path: str, body: bytes, status: int, param: str | None
) -> None:
    async def go() -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as s, s.post(engine.url + path, data=body) as r:
            return r.status, await r.json()

    got_status, payload = asyncio.run(go())
    assert got_status == status
    error = payload.get("error", payload)
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["message"]


def test_full_queue_answers_503_with_retry_after() -> None:
    async def go(url: str) -> list[tuple[int, str | None]]:
        async with aiohttp.ClientSession() as s:

            async def one() -> tuple[int, str | None]:
                async with s.post(
                    url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 200}
                ) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After")

            return await asyncio.gather(*(one() for _ in range(8)))

    args = ["--time-scale", "0.01", "--max-running-requests", "1", "--max-queued-requests", "1"]
    with running_engine(args) as proc:
        results = asyncio.run(go(proc.url))
    assert (200, None) in results
    assert any(status == 503 and retry == "1" for status, retry in results)
