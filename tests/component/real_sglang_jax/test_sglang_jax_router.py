"""A real SGLang-JAX engine (CPU, tiny Qwen3) behind `tpuserve router`, driven with the openai
client: non-streamed and streamed completions and chat with usage, and a repeated prefix coming
back as cached tokens, as the engine itself counts them (`--enable-cache-report`).

The router reads the engine's load: it detects it as SGLang-JAX (`--engine-type auto`, the
default) and polls `/get_server_info`'s internal state, which shows a request another client
sent to the engine directly.

The router is the `tpuserve router` command (a process of its own) with one static worker;
SGLang-JAX publishes no KV events, so it runs without them (`--no-kv-events`, the approximate
`cache_aware` policy). Needs the opt-in build (`scripts/build-sglang-jax.sh SRC`); skips
without it, saying so.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from sglang_tpu.tokenizer import load_tokenizer, render_chatml
from tests.component.router.router_fleet import RouterProcess
from tests.real_sglang_jax import REQUEST_TIMEOUT_SECONDS, RealJaxEngine
from tests.waiting import eventually

pytestmark = [pytest.mark.component, pytest.mark.real_sglang_jax]

PAGE = 16
SHARED_PREFIX = list(range(300, 300 + 4 * PAGE))  # four whole pages of ordinary token ids
ROUTER_READY_SECONDS = 60.0


@pytest.fixture(scope="module")
def router(real_jax_engine: RealJaxEngine) -> Iterator[RouterProcess]:
    process = RouterProcess(
        args=[
            *("--worker", real_jax_engine.url),
            *("--tokenizer", str(real_jax_engine.model_path / "tokenizer.json")),
            *("--policy", "cache_aware"),
            "--no-kv-events",
            *("--load-poll-interval", "0.2"),
            # its /health takes a step; the CPU engine's steps are slow on a busy machine
            *("--health-check-timeout", "10"),
            # a batch shape the engine has not run yet compiles first (5-50 s on a busy CPU)
            *("--first-byte-timeout-floor", str(REQUEST_TIMEOUT_SECONDS)),
            *("--stream-idle-timeout", str(REQUEST_TIMEOUT_SECONDS)),
            *("--request-timeout", str(REQUEST_TIMEOUT_SECONDS)),
        ]
    ).start()
    try:
        eventually(
            lambda: _routable(process.url, real_jax_engine.model),
            what="the router to list the SGLang-JAX engine's model",
            timeout_seconds=ROUTER_READY_SECONDS,
            context=process.log,
        )
        yield process
    finally:
        process.stop()


def _routable(url: str, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
            return model in {m["id"] for m in json.load(response)["data"]}
    except OSError:
        return False


@pytest.fixture
def client(router: RouterProcess, real_jax_engine: RealJaxEngine) -> Iterator[openai.OpenAI]:
    real_jax_engine.flush_cache()
    with openai.OpenAI(
        base_url=f"{router.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=REQUEST_TIMEOUT_SECONDS,
    ) as api:
        yield api


def test_completion_and_chat_answer_with_usage(
    client: openai.OpenAI, real_jax_engine: RealJaxEngine
) -> None:
    tokenizer = load_tokenizer(str(real_jax_engine.model_path / "tokenizer.json"))
    prompt = "The router passes this to SGLang-JAX."
    completion = client.completions.create(
        model=real_jax_engine.model, prompt=prompt, max_tokens=3, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert completion.model == real_jax_engine.model
    assert isinstance(completion.choices[0].text, str)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert completion.usage.completion_tokens == 3

    messages = [{"role": "user", "content": "Answer through the router."}]
    chat = client.chat.completions.create(
        model=real_jax_engine.model, messages=messages, max_tokens=3, temperature=0,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.choices[0].message.role == "assistant"
    assert isinstance(chat.choices[0].message.content, str)
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 3
    rendered = render_chatml(messages)
    assert chat.usage.prompt_tokens == len(tokenizer.encode(rendered))


def test_streamed_chat_ends_with_usage(
    client: openai.OpenAI, real_jax_engine: RealJaxEngine
) -> None:
    stream = client.chat.completions.create(
        model=real_jax_engine.model,
        messages=[{"role": "user", "content": "Stream through the router."}],
        max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert content, f"no content chunk in {chunks}"
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finished] == ["length"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage, "no usage chunk"
    assert usage[-1].completion_tokens == 4
    assert chunks[-1].usage is not None
    assert chunks[-1].choices == []


def test_a_repeated_prefix_comes_back_as_cached_tokens(
    client: openai.OpenAI, real_jax_engine: RealJaxEngine
) -> None:
    cached = []
    for tail in (list(range(600, 608)), list(range(700, 708))):
        completion = client.completions.create(
            model=real_jax_engine.model, prompt=SHARED_PREFIX + tail, max_tokens=2,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        usage = completion.usage
        assert usage is not None
        assert usage.prompt_tokens == len(SHARED_PREFIX) + len(tail)
        # SGLang-JAX (unlike SGLang) leaves the details out (null) when nothing was cached
        details = usage.prompt_tokens_details
        cached.append(details.cached_tokens if details is not None else None)
    print(f"\nMEASURED cached tokens of a 72-token prompt sent after one sharing 64: {cached}")
    assert cached[0] is None
    assert cached[1] is not None, "the engine runs with --enable-cache-report"
    assert cached[1] % real_jax_engine.page_size == 0, cached
    assert len(SHARED_PREFIX) - real_jax_engine.page_size <= cached[1] <= len(SHARED_PREFIX)


def workers(router: RouterProcess) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{router.url}/workers", timeout=10) as response:
        return {w["url"]: w for w in json.load(response)["workers"]}


def router_metrics(router: RouterProcess) -> str:
    with urllib.request.urlopen(f"{router.url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_the_router_reads_the_engines_load_from_its_server_info(
    router: RouterProcess, real_jax_engine: RealJaxEngine
) -> None:
    """Detected as SGLang-JAX; a streamed request another client sends to the engine itself
    shows in the router's view of it as running (the router did not send it)."""
    url = real_jax_engine.url

    def detected_idle() -> dict[str, Any] | None:
        worker = workers(router)[url]
        load = worker["engine_load"]
        idle = load is not None and (load["running"], load["waiting"]) == (0, 0)
        return worker if worker["engine_type"] == "sglang-jax" and idle else None

    worker = eventually(detected_idle, what="the worker detected as SGLang-JAX, polled idle",
                        timeout_seconds=60, context=router.log)  # fmt: skip
    print(f"\nMEASURED the router's view of an idle SGLang-JAX engine: {worker}")
    assert "approximate" in worker["prefix_routing"]
    assert f'tpuserve_router_worker_engine_info{{engine_type="sglang-jax",worker="{url}"}} 1.0' in (
        router_metrics(router)
    )
    parts = urlsplit(url)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    try:
        body = {"input_ids": list(range(400, 440)), "stream": True,
                "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}  # fmt: skip
        connection.request("POST", "/generate", json.dumps(body),
                           {"Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: ")  # it is running

        def running() -> dict[str, Any] | None:
            load = workers(router)[url]["engine_load"]
            return load if load and load["running"] == 1 else None

        load = eventually(running, what="the engine's own request in the router's view",
                          timeout_seconds=60, context=router.log)  # fmt: skip
        print(f"MEASURED the router's view with one request running on it: {load}")
        assert load["kv_usage"] > 0
        text = router_metrics(router)
        assert f'tpuserve_router_worker_engine_requests{{state="running",worker="{url}"}} 1.0' in (
            text
        )
        abort = urllib.request.Request(
            f"{url}/abort_request", data=b'{"abort_all": true}',
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(abort, timeout=30) as aborted:
            assert aborted.status == 200
    finally:
        connection.close()

    def idle_again() -> bool:
        load = workers(router)[url]["engine_load"]
        return bool(load and load["running"] == 0)

    eventually(idle_again, what="the aborted request gone from the view", timeout_seconds=60)
