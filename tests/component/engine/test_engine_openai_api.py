"""The official openai client works against `tpuserve engine sim`; bad input gets named 4xx;
usage, meta_info and error bodies have SGLang 0.5.23's shapes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from sglang_tpu.sim.native_api import TIMING_KEYS
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
        ["--time-scale", "0", "--served-model-name", MODEL, "--context-length", "4096",
         "--enable-cache-report"]
    ) as proc:  # fmt: skip
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


def test_continuous_usage_stats_put_running_usage_on_every_content_chunk(
    engine: EngineProcess,
) -> None:
    """As SGLang 0.5.23 (``should_include_usage``, ``_generate_stream_content``): chat's content
    chunks and every completions chunk carry the prompt and the tokens generated so far; chat's
    role and finish chunks carry none; the final usage chunk comes only with include_usage."""

    async def events(path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.post(engine.url + path, json=body) as r:
            text = await r.text()
        return [json.loads(line[6:]) for line in text.splitlines()
                if line.startswith("data: {")]  # fmt: skip

    options = {"continuous_usage_stats": True}
    chat = asyncio.run(events("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 4,
        "stream": True, "stream_options": options,
    }))  # fmt: skip
    content = [e for e in chat if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert content
    running = [e["usage"]["completion_tokens"] for e in content]
    assert running == sorted(running)
    assert running[-1] == 4
    prompt = content[0]["usage"]["prompt_tokens"]
    assert prompt > 0
    totals = [e["usage"]["total_tokens"] - e["usage"]["completion_tokens"] for e in content]
    assert set(totals) == {prompt}
    assert content[0]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0  # cache reported
    others = [e for e in chat if e not in content]
    assert others
    assert all("usage" not in e for e in others)  # role and finish chunks; no final usage chunk

    plain = asyncio.run(events("/v1/completions", {
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "stream": True,
        "stream_options": {"continuous_usage_stats": True, "include_usage": True},
    }))  # fmt: skip
    per_chunk = [e for e in plain if e["choices"]]
    assert [e["usage"]["completion_tokens"] for e in per_chunk][-1] == 3
    assert all(e["usage"]["prompt_tokens_details"] is None for e in per_chunk)
    assert plain[-1]["choices"] == []
    assert plain[-1]["usage"]["completion_tokens"] == 3  # include_usage's final chunk too

    without = asyncio.run(events("/v1/completions", {
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 2, "stream": True,
    }))  # fmt: skip
    assert all(e["usage"] is None for e in without)


def test_same_prompt_twice_reports_cached_tokens_in_whole_pages(client: openai.OpenAI) -> None:
    content = LONG_PROMPT + " who measured the speed of light?"
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3
    )
    second = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3
    )
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert 0 < cached < second.usage.prompt_tokens
    assert cached % 16 == 0  # the radix cache matches whole pages (--page-size 16)
    assert second.choices[0].message.content == first.choices[0].message.content


def test_without_cache_report_usage_has_no_cached_tokens() -> None:
    """As SGLang: prompt_tokens_details is null (absent when streamed) without the flag."""

    async def go(url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        body = {"prompt": LONG_PROMPT, "max_tokens": 2}
        async with aiohttp.ClientSession() as s:
            for _ in range(2):  # the second one hits the cache
                async with s.post(url + "/v1/completions", json=body) as r:
                    plain = await r.json()
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with s.post(url + "/v1/completions", json=streamed) as r:
                events = [line async for line in r.content if line.startswith(b"data: {")]
        return plain, [json.loads(e.removeprefix(b"data: ")) for e in events]

    with running_engine(["--time-scale", "0"]) as proc:
        plain, chunks = asyncio.run(go(proc.url))
    assert plain["usage"]["prompt_tokens_details"] is None
    assert plain["usage"]["completion_tokens"] == 2
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    assert "prompt_tokens_details" not in usage
    assert usage["completion_tokens"] == 2


def test_stream_interval_sends_the_first_token_then_a_chunk_every_n_tokens() -> None:
    """As SGLang's --stream-interval: a streamed chat gets its first token in a chunk of its
    own, then the tokens in chunks of N (the last may be shorter), all of them in the end."""

    async def go(url: str) -> list[dict[str, Any]]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Count."}],
                "max_tokens": 10, "stream": True,
                "stream_options": {"continuous_usage_stats": True}}  # fmt: skip
        chat = url + "/v1/chat/completions"
        async with aiohttp.ClientSession() as s, s.post(chat, json=body) as r:
            events = [line async for line in r.content if line.startswith(b"data: {")]
        return [json.loads(e.removeprefix(b"data: ")) for e in events]

    with running_engine(["--time-scale", "0", "--served-model-name", MODEL,
                         "--stream-interval", "4"]) as proc:  # fmt: skip
        chunks = asyncio.run(go(proc.url))
    running = [c["usage"]["completion_tokens"] for c in chunks
               if c["choices"] and c["choices"][0]["delta"].get("content")]  # fmt: skip
    assert running == [1, 5, 9, 10]


def post_generate(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON body of a /generate answer, or every streamed chunk of it."""

    async def go() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
            assert r.status == 200
            if not body.get("stream"):
                return [await r.json()]
            return [
                json.loads(line.removeprefix(b"data: "))
                async for line in r.content
                if line.startswith(b"data: {")
            ]

    return asyncio.run(go())


# SGLang 0.5.23's meta_info of a finished plain-text request (observed on a real engine with
# --enable-metrics, as the launcher starts it).
FINISHED_META_KEYS = {
    "id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions",
    "storage_prefetch_wait", "storage_staging_wait", "forward_entry_time",
    "prefill_finished_time", "queue_time", "reasoning_tokens", "completion_tokens",
    "cached_tokens", "weight_versions", "cached_tokens_details", "dp_rank", "e2e_latency",
    "request_received_ts", "first_token_latency", "api_server_dispatch_finish_ts",
    "request_finished_ts", "decode_throughput", "response_sent_to_client_ts",
}  # fmt: skip
FINISHED_ONLY_KEYS = {
    "weight_versions", "e2e_latency", "request_received_ts", "first_token_latency",
    "api_server_dispatch_finish_ts", "request_finished_ts", "decode_throughput",
}  # fmt: skip


def test_native_generate_reports_sglangs_meta_info(engine: EngineProcess) -> None:
    body = {"text": LONG_PROMPT, "sampling_params": {"max_new_tokens": 4}}
    (first,) = post_generate(engine.url, body)
    (again,) = post_generate(engine.url, body)
    meta = again["meta_info"]
    assert meta.keys() == FINISHED_META_KEYS
    assert TIMING_KEYS <= FINISHED_META_KEYS
    assert meta["completion_tokens"] == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 4}]
    assert meta["cached_tokens"] > 0
    assert meta["cached_tokens_details"] == {"device": meta["cached_tokens"], "host": 0}
    assert first["meta_info"]["cached_tokens_details"] is None
    assert meta["e2e_latency"] >= meta["first_token_latency"] >= 0


def test_streamed_generate_reports_end_to_end_timings_only_at_the_end(
    engine: EngineProcess,
) -> None:
    chunks = post_generate(
        engine.url, {"text": "stream me", "stream": True, "sampling_params": {"max_new_tokens": 3}}
    )
    assert len(chunks) == 3
    first, middle, last = [c["meta_info"] for c in chunks]
    for meta in (first, middle):
        assert meta["finish_reason"] is None
    # as SGLang's: the time the response went out, on the first chunk and again on the last
    sent = "response_sent_to_client_ts"
    assert first.keys() == FINISHED_META_KEYS - FINISHED_ONLY_KEYS
    assert middle.keys() == FINISHED_META_KEYS - FINISHED_ONLY_KEYS - {sent}
    assert last.keys() == FINISHED_META_KEYS
    assert last[sent] == first[sent]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a value SGLang refuses: {"error": {"message": ...}}
        (b'{"sampling_params": {}}', {"error": {"message": str}}),
        (b'{"text": "hi", "sampling_params": {"max_new_tokens": -1}}', {"error": {"message": str}}),
        # a sampling parameter of the wrong type (the API contract check): {"error": "..."}
        (b'{"text": "hi", "sampling_params": {"max_new_tokens": "x"}}', {"error": str}),
        # not a valid request body (FastAPI validation): an OpenAI error object
        (b"{not json", {"object": "error", "message": str, "type": "Bad Request", "param": None,
                        "code": 400}),
        (b'{"text": 5}', {"object": "error", "message": str, "type": "Bad Request",
                          "param": None, "code": 400}),
    ],
)  # fmt: skip
def test_native_errors_have_sglangs_bodies(
    engine: EngineProcess, body: bytes, expected: dict[str, Any]
) -> None:
    async def go() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.post(engine.url + "/generate", data=body) as r:
            return r.status, await r.json()

    status, payload = asyncio.run(go())
    assert status == 400
    assert matches(payload, expected), payload


def matches(value: Any, expected: Any) -> bool:
    """`value` has the shape of `expected`, where `str` stands for any string (a message)."""
    if expected is str:
        return isinstance(value, str) and bool(value)
    if isinstance(expected, dict):
        return (
            isinstance(value, dict)
            and value.keys() == expected.keys()
            and all(matches(value[k], v) for k, v in expected.items())
        )
    return bool(value == expected)


def test_server_info_is_current_and_get_server_info_its_deprecated_alias(
    engine: EngineProcess,
) -> None:
    async def go() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            bodies = []
            for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
                async with s.get(engine.url + path) as r:
                    assert r.status == 200, path
                    bodies.append(await r.json())
            return bodies

    info, old_info, model, old_model = asyncio.run(go())
    assert info.keys() == old_info.keys()
    assert model == old_model
    assert info["version"] == "0.5.23"
    assert info["enable_cache_report"] is True
    assert info["served_model_name"] == MODEL
    assert info["kv_events"] is None  # this engine publishes no KV events
    assert {"launch_command", "startup_time", "internal_states", "max_total_num_tokens",
            "max_req_input_len", "page_size", "tp_size", "dp_size"} <= info.keys()  # fmt: skip
    assert model["served_model_name"] == MODEL
    assert model["weight_version"] == "default"


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
