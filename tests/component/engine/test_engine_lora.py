"""The twin serves LoRA adapters as SGLang 0.5.23 does: its /v1/models cards, ``BASE:ADAPTER``
and ``lora_path`` accepted for a loaded adapter, SGLang's 400 for one never loaded (an error
event in a streamed /generate) and for any adapter when LoRA is off."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import orjson
import pytest
import requests

from tests.component.engine.engine_process import EngineProcess, running_engine

pytestmark = pytest.mark.component

MODEL = "tpuserve/sim-8b"
NEVER_LOADED = "Got LoRA adapter that has never been loaded: nope\nAll loaded adapters: "


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    args = ["--time-scale", "0", "--served-model-name", MODEL]
    with running_engine([*args, "--lora-paths", "sql=/lora/sql", "/lora/chat"]) as proc:
        yield proc


def client(engine: EngineProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_model_then_each_adapter(engine: EngineProcess) -> None:
    listing = requests.get(engine.url + "/v1/models", timeout=10).json()
    cards = [(m["id"], m["root"], m["parent"], m["max_model_len"] is None) for m in listing["data"]]
    assert cards == [
        (MODEL, MODEL, None, False),
        ("sql", "/lora/sql", MODEL, True),
        ("/lora/chat", "/lora/chat", MODEL, True),  # a bare PATH is named by its path
    ]
    assert {m["owned_by"] for m in listing["data"]} == {"sglang"}


def test_a_loaded_adapter_is_served_by_either_name(engine: EngineProcess) -> None:
    oa = client(engine)
    answer = oa.completions.create(model=f"{MODEL}:sql", prompt="hi", max_tokens=2)
    assert answer.model == f"{MODEL}:sql"  # echoed, as SGLang
    assert oa.completions.create(
        model=MODEL, prompt="hi", max_tokens=2, extra_body={"lora_path": "sql"}
    ).choices
    body = {"text": "hi", "lora_path": "sql"}
    assert requests.post(engine.url + "/generate", json=body, timeout=10).status_code == 200


def test_an_adapter_never_loaded_is_sglangs_400(engine: EngineProcess) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client(engine).completions.create(model=f"{MODEL}:nope", prompt="hi", max_tokens=2)
    body = raised.value.body
    assert isinstance(body, dict)
    assert body["message"] == NEVER_LOADED + "dict_keys(['sql', '/lora/chat'])."
    assert (body["type"], body["code"]) == ("BadRequestError", 400)
    native = {"text": "hi", "lora_path": "nope"}
    answer = requests.post(engine.url + "/generate", json=native, timeout=10)
    assert answer.status_code == 400
    assert answer.json() == {"error": {"message": body["message"]}}
    streamed = requests.post(
        engine.url + "/generate", json={**native, "stream": True}, timeout=10
    )  # SGLang finds it once the stream has started
    assert streamed.status_code == 200
    events = [line.removeprefix(b"data: ") for line in streamed.content.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    error = orjson.loads(events[0])["error"]
    assert (error["message"], error["code"], error["retryable"]) == (body["message"], 400, False)


def test_without_lora_any_adapter_is_refused() -> None:
    with running_engine(["--time-scale", "0", "--served-model-name", MODEL]) as engine:
        with pytest.raises(openai.BadRequestError) as raised:
            client(engine).completions.create(model=f"{MODEL}:sql", prompt="hi", max_tokens=2)
        body = raised.value.body
        assert isinstance(body, dict)
        assert str(body["message"]).startswith(
            "LoRA adapter 'sql' was requested, but LoRA is not enabled."
        )
        listing = requests.get(engine.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in listing["data"]] == [MODEL]
