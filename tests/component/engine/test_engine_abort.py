"""The twin stops work as SGLang 0.5.23 does: ``/abort_request`` by rid (or all), a
non-streamed request whose client left, and it refuses a request asking for more tokens than
the context holds (400, SGLang's message) instead of silently capping it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.component.engine.engine_process import (
    EngineProcess,
    running_engine,
    running_requests,
)
from tests.waiting import eventually_async

pytestmark = pytest.mark.component

CONTEXT = 4096


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    """A twin on the real clock (a decode step is ~16 ms), so requests run long enough."""
    with running_engine(["--time-scale", "1", "--context-length", str(CONTEXT)]) as proc:
        yield proc


async def test_abort_request_stops_the_request_with_that_rid(engine: EngineProcess) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "a long story", "max_tokens": 3000, "rid": "to-abort"}
        call = asyncio.ensure_future(session.post(engine.url + "/v1/completions", json=body))
        await eventually_async(
            lambda: running_requests(session, engine.url), what="the request running"
        )
        async with session.post(engine.url + "/abort_request", json={"rid": "unknown"}) as r:
            assert r.status == 200  # an unknown rid is ignored, as SGLang does
        assert await running_requests(session, engine.url) == 1
        async with session.post(engine.url + "/abort_request", json={"rid": "to-abort"}) as r:
            assert (r.status, await r.read()) == (200, b"")
        response = await call
        answer = await response.json()
        assert answer["id"] == "to-abort"  # SGLang names the answer after the rid
        assert answer["usage"]["completion_tokens"] < 3000
        assert await running_requests(session, engine.url) == 0


async def test_a_non_streamed_request_whose_client_left_is_aborted(engine: EngineProcess) -> None:
    body = orjson.dumps({"prompt": "another long story", "max_tokens": 3000})
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: e\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )
    async with aiohttp.ClientSession() as session:
        await eventually_async(
            lambda: running_requests(session, engine.url), what="the request running"
        )
        writer.close()  # the client goes away

        async def idle() -> bool:
            return await running_requests(session, engine.url) == 0

        await eventually_async(idle, what="the abandoned request aborted")


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/v1/completions", {"prompt": "hi there", "max_tokens": CONTEXT},
         lambda m: {"object": "error", "message": m, "type": "BadRequestError", "param": None,
                    "code": 400}),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 * CONTEXT},
         lambda m: {"object": "error", "message": m, "type": "BadRequestError", "param": None,
                    "code": 400}),
        ("/generate", {"text": "hi there", "sampling_params": {"max_new_tokens": CONTEXT}},
         lambda m: {"error": {"message": m}}),
    ],
)  # fmt: skip
async def test_max_tokens_beyond_the_context_is_refused_as_sglang_refuses_it(
    engine: EngineProcess, path: str, body: dict[str, Any], expected: Any
) -> None:
    async with aiohttp.ClientSession() as session, session.post(engine.url + path, json=body) as r:
        status, answer = r.status, await r.json()
    assert status == 400
    message = answer["error"]["message"] if "error" in answer else answer["message"]
    assert message.startswith(
        f"Requested token count exceeds the model's maximum context length of {CONTEXT} "
        "tokens. You requested a total of "
    )
    assert answer == expected(message)


async def test_a_chat_without_max_tokens_is_not_refused(engine: EngineProcess) -> None:
    async def chat(words: int, **extra: int) -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": "word " * words}], **extra}
        async with (
            aiohttp.ClientSession() as session,
            session.post(engine.url + "/v1/chat/completions", json=body) as r,
        ):
            assert r.status == 200, await r.text()
            answer: dict[str, Any] = await r.json()
            return answer

    at_100 = (await chat(100, max_tokens=1))["usage"]["prompt_tokens"]
    per_word = ((await chat(200, max_tokens=1))["usage"]["prompt_tokens"] - at_100) // 100
    words = 100 + (CONTEXT - 40 - at_100) // per_word  # about 40 tokens short of the context
    usage = (await chat(words))["usage"]  # the default, 128 new tokens, would not fit
    assert CONTEXT - 128 < usage["prompt_tokens"] < CONTEXT
    assert usage["completion_tokens"] == CONTEXT - usage["prompt_tokens"]  # up to the context
