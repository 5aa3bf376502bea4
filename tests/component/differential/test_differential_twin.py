"""The engine twin answers like real SGLang 0.5.23: the same requests go to one real engine and
one twin configured alike (page size 16, cached tokens reported, the tiny model's tokenizer,
KV events on), and everything a client sees is compared — native and OpenAI answers and their
streamed chunks, usage and cached tokens, error bodies, the `/server_info` keys clients read,
the metric families of the live `/metrics`, and the KV events as SGLang's own classes decode
them. What differs on purpose is listed once, in `tests/twin_differences.py`.

A test switches a twin back to the 0.5.6-0.5.19 event encoding and shows the KV-event
comparison catches it. The last ones abort a request mid-way on the real engine and on a twin
on the real clock (`--time-scale 1`), and compare how each ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_tpu.kv_events import Wire
from sglang_tpu.sim.kv_publisher import WIRE_ENV
from tests import sglang_metrics as sm
from tests.component.differential import kv_tap
from tests.component.differential.compare import json_differences
from tests.component.differential.engine_pair import (
    GREEDY,
    Answer,
    EnginePair,
    assert_alike,
    ids,
    kv_endpoints,
    request,
    twin_args,
    twin_like,
)
from tests.component.engine.engine_process import EngineProcess, running_engine
from tests.real_sglang import RealEngine
from tests.twin_differences import (
    REFUSED_BY_THE_TWIN,
    SERVED_ONLY_BY_THE_TWIN,
    metric_differences,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

# /server_info keys tpuserve's router, `tpuserve up` and the bench read (kv_publishers.py,
# local_prometheus.py) and the values they must agree on when configured alike.
SERVER_INFO_KEYS = ("kv_events", "kv_events_config", "dp_size", "served_model_name",
                    "model_path", "tokenizer_path", "page_size", "max_total_num_tokens",
                    "max_req_input_len", "enable_cache_report", "version", "status")  # fmt: skip
SAME_VALUE_KEYS = ("dp_size", "served_model_name", "model_path", "tokenizer_path", "page_size",
                   "max_total_num_tokens", "enable_cache_report", "version", "status")  # fmt: skip
KV_EVENTS_SAME_VALUES = ("publisher", "endpoint_host", "topic", "block_size", "dp_size")


@pytest.fixture(scope="module")
def twin(real_engine: RealEngine) -> Iterator[EngineProcess]:
    with twin_like(real_engine, enable_cache_report=True) as process:
        yield process


@pytest.fixture(scope="module")
def pair(real_engine: RealEngine, twin: EngineProcess) -> EnginePair:
    return EnginePair(real_engine, twin)


# --- answers -----------------------------------------------------------------------------


def test_native_generate_answers_alike(pair: EnginePair) -> None:
    assert_alike(*pair.post(
        "/generate", {"input_ids": ids(100, 40), "sampling_params": {"max_new_tokens": 3, **GREEDY}}
    ))  # fmt: skip
    real, twin = pair.post(
        "/generate",
        {"text": "The differential twin streams.", "stream": True,
         "sampling_params": {"max_new_tokens": 4, **GREEDY}},
    )  # fmt: skip
    assert_alike(real, twin)
    assert real.data_chunks[-1]["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize("stream", [False, True])
def test_openai_completions_answer_alike(pair: EnginePair, stream: bool) -> None:
    body = {"model": pair.real.model, "prompt": "Compare the completions.", "max_tokens": 4,
            "stream": stream, **GREEDY}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    assert_alike(*pair.post("/v1/completions", body))


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_answers_alike(pair: EnginePair, stream: bool) -> None:
    body = {"model": pair.real.model, "max_tokens": 4, "stream": stream, **GREEDY,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Compare the chats."}]}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    assert_alike(*pair.post("/v1/chat/completions", body))


@pytest.mark.parametrize("stream", [False, True])
def test_a_continued_assistant_message_answers_alike(pair: EnginePair, stream: bool) -> None:
    """``continue_final_message``, the router's chat migration (`pipeline.migration`): the
    messages before the assistant's rendered with the generation prompt, its text's tokens
    appended; the prompt's token count (usage) is the same on both."""
    body = {"model": pair.real.model, "max_tokens": 4, "stream": stream, **GREEDY,
            "continue_final_message": True,
            "messages": [{"role": "user", "content": "Compare the chats."},
                         {"role": "assistant", "content": "The chats compare"}]}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    assert_alike(*pair.post("/v1/chat/completions", body))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_stream_alike(pair: EnginePair, path: str) -> None:
    """``stream_options.continuous_usage_stats``: running usage on the chunks SGLang puts it."""
    body: dict[str, Any] = {"model": pair.real.model, "max_tokens": 4, "stream": True, **GREEDY,
                            "stream_options": {"continuous_usage_stats": True}}  # fmt: skip
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Compare the running usage."}]
    else:
        body["prompt"] = "Compare the running usage."
    assert_alike(*pair.post(path, body))


def test_cached_tokens_are_whole_pages_alike(pair: EnginePair) -> None:
    """A prompt sent twice: the second is cached up to its last full page before the last
    token (48 tokens: 32), reported in meta_info and in OpenAI usage."""
    page = pair.real.page_size
    native = {
        "input_ids": ids(300, 3 * page + 2),
        "sampling_params": {"max_new_tokens": 2, **GREEDY},
    }
    openai = {"model": pair.real.model, "prompt": ids(400, 3 * page), "max_tokens": 2, **GREEDY}
    for path, body in (("/generate", native), ("/v1/completions", openai)):
        for _ in range(2):
            real, twin = pair.post(path, body)
            assert_alike(real, twin)
    assert real.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2 * page}


# --- errors ------------------------------------------------------------------------------

BAD_REQUESTS = {
    "generate: not JSON": ("/generate", b"{not json"),
    "generate: text of the wrong type": ("/generate", b'{"text": 5}'),
    "generate: sampling_params of the wrong type":
        ("/generate", b'{"text": "x", "sampling_params": 5}'),
    "generate: stream of the wrong type": ("/generate", b'{"text": "x", "stream": "x"}'),
    "generate: max_new_tokens of the wrong type":
        ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": "x"}}'),
    "generate: temperature of the wrong type":
        ("/generate", b'{"text": "x", "sampling_params": {"temperature": "x"}}'),
    "generate: no prompt": ("/generate", b'{"sampling_params": {"max_new_tokens": 1}}'),
    "generate: negative max_new_tokens":
        ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": -1}}'),
    "generate: negative temperature":
        ("/generate", b'{"text": "x", "sampling_params": {"temperature": -1}}'),
    "generate: longer than the context": ("/generate", None),
    "completions: not JSON": ("/v1/completions", b"{not json"),
    "completions: no prompt": ("/v1/completions", b'{"max_tokens": 1}'),
    "completions: prompt of the wrong type": ("/v1/completions", b'{"prompt": 5}'),
    "completions: empty prompt": ("/v1/completions", b'{"prompt": "", "max_tokens": 1}'),
    "completions: max_tokens 0": ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}'),
    "completions: max_tokens of the wrong type":
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "x"}'),
    "completions: stream of the wrong type": ("/v1/completions", b'{"prompt": "x", "stream": "x"}'),
    "completions: longer than the context": ("/v1/completions", None),
    "chat: no messages": ("/v1/chat/completions", b'{"max_tokens": 1}'),
    "chat: empty messages": ("/v1/chat/completions", b'{"messages": []}'),
    "chat: max_tokens of the wrong type": ("/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "x"}'),
    "chat: negative max_tokens": ("/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}'),
    "chat: negative temperature": ("/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}'),
}  # fmt: skip


def too_long(pair: EnginePair, path: str) -> dict[str, Any]:
    """A prompt one token longer than the context both engines have."""
    context = pair.real.get_json("/v1/models")["data"][0]["max_model_len"]
    prompt = [16 + i % 2000 for i in range(context + 1)]
    if path == "/generate":
        return {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}
    return {"prompt": prompt, "max_tokens": 1}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_requests_get_the_same_error_bodies(pair: EnginePair, case: str) -> None:
    path, body = BAD_REQUESTS[case]
    real, twin = pair.post(path, body if body is not None else too_long(pair, path))
    assert real.status == twin.status, (real, twin)
    assert 400 <= real.status < 500, real
    found = json_differences(real.body, twin.body)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("case", REFUSED_BY_THE_TWIN)
def test_what_only_the_twin_refuses_is_still_refused_only_by_it(
    pair: EnginePair, case: str
) -> None:
    refusal = REFUSED_BY_THE_TWIN[case]
    twin = request(pair.twin.url, "POST", refusal.path, refusal.body)
    assert 400 <= twin.status < 500, twin
    if not refusal.crashes_real:  # listed as a difference: SGLang must still serve it
        real = request(pair.real.url, "POST", refusal.path, refusal.body)
        assert real.status == 200, f"SGLang refuses {case} too now; drop it from the list: {real}"


def test_an_adapter_without_lora_gets_sglangs_error(pair: EnginePair) -> None:
    """Neither engine has LoRA on: naming an adapter (``SERVED:NAME`` or ``lora_path``) gets
    SGLang's 400, word for word (the router reads these names the same way)."""
    served = pair.real.get_json("/server_info")["served_model_name"]
    requests = [
        ("/v1/completions", {"model": f"{served}:sql", "prompt": "hi", "max_tokens": 1}),
        ("/v1/completions", {"model": served, "prompt": "hi", "max_tokens": 1,
                             "lora_path": "sql"}),
        ("/generate", {"text": "hi", "lora_path": "sql"}),
        ("/generate", {"text": "hi", "lora_path": "sql", "stream": True}),
    ]  # fmt: skip
    for path, body in requests:
        real, twin = pair.post(path, body)
        assert (real.status, real.body, real.chunks) == (twin.status, twin.body, twin.chunks), (
            path, body, real, twin,
        )  # fmt: skip
        assert real.status == (200 if body.get("stream") else 400), real


# --- server and model info ---------------------------------------------------------------


def test_server_info_keys_clients_read_agree(pair: EnginePair) -> None:
    real, twin = (answer.body for answer in pair.get("/server_info"))
    assert set(twin) - {"tpuserve"} <= set(real), sorted(set(twin) - set(real))
    for key in SERVER_INFO_KEYS:
        assert key in real, key
        assert key in twin, key
        assert type(real[key]) is type(twin[key]), (key, real[key], twin[key])
    assert {k: real[k] for k in SAME_VALUE_KEYS} == {k: twin[k] for k in SAME_VALUE_KEYS}
    r_events, t_events = real["kv_events"], twin["kv_events"]
    assert r_events.keys() == t_events.keys()
    assert {k: r_events[k] for k in KV_EVENTS_SAME_VALUES} == {
        k: t_events[k] for k in KV_EVENTS_SAME_VALUES
    }
    for info, engine_url in ((real, pair.real.url), (twin, pair.twin.url)):
        assert kv_endpoints(engine_url)[0] == "tcp://{endpoint_host}:{endpoint_port_base}".format(
            **info["kv_events"]
        )


def test_model_info_and_models_agree(pair: EnginePair) -> None:
    for path in ("/model_info", "/v1/models"):
        real, twin = pair.get(path)
        assert (real.status, twin.status) == (200, 200), path
        if path == "/v1/models":  # the creation time is a clock reading
            for body in (real.body, twin.body):
                body["data"][0].pop("created")
        found = json_differences(real.body, twin.body)
        assert not found, f"{path}:\n" + "\n".join(found)


def test_loads_and_flush_agree(pair: EnginePair) -> None:
    """`/v1/loads` of two idle engines whose last request was the same, then `/flush_cache`."""
    body = {"input_ids": ids(800, 40), "sampling_params": {"max_new_tokens": 2, **GREEDY}}
    assert_alike(*pair.post("/generate", body))  # the last prefill batch is the same

    def idle_loads() -> tuple[Any, Any] | None:
        """Both engines' loads once both are idle: SGLang's scheduler may count the request
        as running for a moment after its answer went out (seen on a loaded machine)."""
        answers = pair.get("/v1/loads")
        assert all(a.status == 200 for a in answers), answers
        busy = any(
            rank["num_running_reqs"] or rank["num_waiting_reqs"]
            for a in answers
            for rank in a.body["loads"]
        )
        return None if busy else answers

    real, twin = eventually(idle_loads, what="both engines idle")
    found = json_differences(real.body, twin.body)
    assert not found, "\n".join(found)
    real, twin = pair.post("/flush_cache", b"")
    assert (real.status, real.body) == (twin.status, twin.body)


@pytest.mark.parametrize("path", SERVED_ONLY_BY_THE_TWIN)
def test_what_only_the_twin_serves_is_still_missing_from_sglang(
    pair: EnginePair, path: str
) -> None:
    real, twin = pair.get(path)
    assert twin.status == 200, twin
    assert real.status == 404, f"SGLang serves {path} now; drop it from the list: {real}"


# --- metrics -----------------------------------------------------------------------------


def families(exposition: str) -> dict[str, sm.ExposedFamily]:
    return sm.exposed_families(text_string_to_metric_families(exposition))


def test_metric_families_agree_on_the_live_metrics(pair: EnginePair) -> None:
    body = {"input_ids": ids(600, 40), "sampling_params": {"max_new_tokens": 2, **GREEDY}}
    for stream in (False, True, True):  # the second streamed one is a cache hit
        for answer in pair.post("/generate", {**body, "stream": stream}):
            assert answer.status == 200, answer
    real, twin = (families(answer.body) for answer in pair.get("/metrics"))
    not_modelled = metric_differences("not_modelled")
    first_use = metric_differences("created_on_first_use")
    unlisted_real = {f for f in set(real) - set(twin) if (f, "not_modelled") not in not_modelled}
    unlisted_twin = {
        f
        for f in set(twin) - set(real)
        if (f, "created_on_first_use") not in first_use
        and not f.startswith("tpuserve_engine_")  # tpuserve's own series (cold start)
    }
    assert not unlisted_real, (
        f"the real engine exposes families the twin lacks: {sorted(unlisted_real)}"
    )
    assert not unlisted_twin, (
        f"the twin exposes families the real engine lacks: {sorted(unlisted_twin)}"
    )
    stale = {f for f, _ in not_modelled if f in twin}
    assert not stale, f"listed as not modelled, but the twin exposes them: {sorted(stale)}"
    declared = {m.family for m in sm.declared_metrics().values()}
    assert {f for f, _ in [*not_modelled, *first_use]} <= declared
    differ = {f: (real[f], twin[f]) for f in set(real) & set(twin) if real[f] != twin[f]}
    assert not differ, "\n".join(f"{f}:\n  real {r}\n  twin {t}" for f, (r, t) in differ.items())
    assert "sglang:cached_tokens" in set(real) & set(twin)  # the cache hit above made it


# What Prometheus sends: 2.x prefers OpenMetrics without an escaping scheme; 3.x asks to keep
# UTF-8 names; none is what a curl or a test client sends.
PROMETHEUS_ACCEPT = {
    "none": "",
    "Prometheus 2": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Prometheus 3": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,*/*;q=0.1",
}


def sglang_spellings(exposition: str) -> set[str]:
    """How the samples spell SGLang's prefix: `sglang:` or, escaped, `sglang_`."""
    return {line[:7] for line in exposition.splitlines() if line.startswith("sglang")}


@pytest.mark.parametrize("client", PROMETHEUS_ACCEPT)
def test_metrics_negotiate_the_format_alike(pair: EnginePair, client: str) -> None:
    """Asked for OpenMetrics without an escaping scheme, both write `sglang_` in the samples
    (prometheus/client_python#1177); local_prometheus puts the colon back."""
    real, twin = pair.get("/metrics", {"Accept": PROMETHEUS_ACCEPT[client]} if client else {})
    assert (real.status, twin.status) == (200, 200)
    assert real.content_type == twin.content_type
    assert sglang_spellings(real.body) == sglang_spellings(twin.body)
    assert len(sglang_spellings(real.body)) == 1, sglang_spellings(real.body)


# --- KV events ---------------------------------------------------------------------------


def kv_prompts(page: int) -> list[kv_tap.Prompt]:
    """Prompt-only pages (one token generated: nothing generated is cached), a shared prefix,
    a repeated prompt, and one request whose output fills pages (stored when it finishes)."""
    a = ids(1000, 2 * page + 8)
    return [
        (a, 1),
        (a[: 2 * page] + ids(1100, page + 4), 1),  # a's first two pages, then a new one
        (a, 1),  # all cached: nothing new to store
        (ids(1200, 6 * page + 4), 1),
        (ids(1400, page + 8), 2 * page),
    ]


def kv_differences(real: RealEngine, twin: EngineProcess) -> list[str]:
    return kv_tap.compare_engines(
        real.url, twin.url, kv_prompts(real.page_size), real.kv_topic, real.page_size
    )


def test_kv_events_agree_as_sglangs_classes_decode_them(pair: EnginePair) -> None:
    found = kv_differences(pair.real, pair.twin)
    assert not found, "\n".join(found)


def test_the_first_batch_of_both_is_all_blocks_cleared(pair: EnginePair) -> None:
    """SGLang's radix cache resets when it is built: its seq 0 clears every block."""
    for url in (pair.real.url, pair.twin.url):
        _, replay = kv_endpoints(url)
        first = kv_tap.replay_from(replay, 0)[0]
        decoded = kv_tap.decode(first)
        assert decoded.error is None, decoded.error
        assert [type(e).__name__ for e in decoded.batch.events] == ["AllBlocksCleared"], url


def test_the_kv_comparison_fails_against_a_twin_on_the_legacy_wire(real_engine: RealEngine) -> None:
    with twin_like(
        real_engine, enable_cache_report=True, env={WIRE_ENV: Wire.LEGACY.value}
    ) as legacy:
        found = kv_differences(real_engine, legacy)
    assert found, "a twin on the 0.5.19 wire passed the KV-event comparison"
    text = "\n".join(found)
    assert "SGLang's decoder refuses the batch: Expected `object`, got `array`" in text, text
    assert "replay frames differ" in text, text


# --- aborts (last: the real engine's cache then holds what the twin of `pair` does not) ----

ABORT_TOKENS = 2000  # far more than either engine generates before the abort arrives


@pytest.fixture(scope="module")
def slow_twin(real_engine: RealEngine) -> Iterator[EngineProcess]:
    """A twin like the real engine on the real clock, so a request runs long enough to abort."""
    args = [*twin_args(real_engine, enable_cache_report=True), "--time-scale", "1"]
    with running_engine(args) as process:
        yield process


def aborted_mid_way(url: str, path: str, stream: bool, rid: str) -> Answer:
    """A long request, aborted by ``/abort_request`` with its rid once the engine runs it."""
    body: dict[str, Any] = {"rid": rid, "stream": stream}
    if path == "/generate":
        body |= {"text": "abort me", "sampling_params": {"max_new_tokens": ABORT_TOKENS, **GREEDY}}
    elif path == "/v1/completions":
        body |= {"prompt": "abort me", "max_tokens": ABORT_TOKENS, **GREEDY}
    else:
        body |= {"messages": [{"role": "user", "content": "abort me"}],
                 "max_tokens": ABORT_TOKENS, **GREEDY}  # fmt: skip
    streaming = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(request, url, "POST", path, body, streaming=streaming)

        def running() -> bool:
            if stream:  # its first event says so at once
                return streaming.is_set()
            # SGLang's /v1/loads is a snapshot its scheduler writes at a prefill and then
            # every 15th decode step (--load-snapshot-publish-interval): on a starved CPU
            # that can lag by seconds, which a streamed request's first event does not.
            (load,) = request(url, "GET", "/v1/loads", None).body["loads"]
            return bool(load["num_running_reqs"])

        def ended_early() -> str:  # the request answered before it was seen running
            if not answer.done():
                return "the request has not been answered yet"
            return f"the request was answered already: {answer.result()!r:.500}"

        eventually(running, what=f"{url} running the request", context=ended_early)
        assert request(url, "POST", "/abort_request", {"rid": rid}).status == 200
        return answer.result()


def how_it_ended(answer: Answer, path: str) -> Any:
    """What says the request was aborted: the OpenAI finish reason (and matched stop), or
    `/generate`'s ``meta_info.finish_reason``."""
    assert answer.status == 200, answer
    last = answer.data_chunks[-1] if answer.chunks is not None else answer.body
    if path == "/generate":
        assert last["meta_info"]["completion_tokens"] < ABORT_TOKENS
        return last["meta_info"]["finish_reason"]
    if answer.chunks is not None:
        ends = [c["choices"][0] for c in answer.data_chunks if c["choices"]]
        return [(e["finish_reason"], e["matched_stop"]) for e in ends if e["finish_reason"]]
    assert last["usage"]["completion_tokens"] < ABORT_TOKENS
    (choice,) = last["choices"]
    return choice["finish_reason"], choice["matched_stop"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_an_aborted_request_ends_alike(
    real_engine: RealEngine, slow_twin: EngineProcess, path: str, stream: bool
) -> None:
    rid = f"abort-{path.rsplit('/', 1)[1]}-{stream}"
    real = how_it_ended(aborted_mid_way(real_engine.url, path, stream, rid), path)
    twin = how_it_ended(aborted_mid_way(slow_twin.url, path, stream, rid), path)
    assert real == twin
    if path != "/generate":
        assert "abort" in str(real)
