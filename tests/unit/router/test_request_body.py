"""Request bodies: what the router validates and the routing inputs it builds from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.pipeline.request_body import (
    ClientError,
    Parser,
    parse_chat,
    parse_completions,
    parse_generate,
    parse_json_object,
)
from tpuserve_router.pipeline.token_cache import ChatTokenCache

pytestmark = pytest.mark.unit
RAW = load_tokenizer()
TOK = ChatTokenCache(RAW)


def test_completion_prompt_gives_text_and_engine_token_ids() -> None:
    parsed = parse_completions({"model": "m", "prompt": "hello world", "stream": True}, True, TOK)
    assert (parsed.model, parsed.stream, parsed.text) == ("m", True, "hello world")
    assert parsed.token_ids == TOK.encode("hello world")


def test_token_prompts_are_used_as_given() -> None:
    parsed = parse_completions({"prompt": [5, 6, 7]}, True, TOK)
    assert parsed.token_ids == [5, 6, 7]
    assert parsed.text == "5 6 7"
    assert parse_completions({"prompt": [[1, 2], [3]]}, False, TOK).token_ids == [1, 2]


def test_chat_token_ids_apply_the_engines_template() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    parsed = parse_chat({"messages": messages}, True, TOK)
    assert parsed.token_ids == RAW.encode(RAW.apply_chat_template(messages))
    assert parsed.text == "system: be brief\nuser: hi\n"


def test_chat_text_parts_and_media_are_routed_on() -> None:
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]
    text = parse_chat({"messages": [{"role": "user", "content": content}]}, True, None).text
    assert text.startswith("user: look{")
    assert '"url":"u"' in text


def test_generate_takes_text_or_input_ids() -> None:
    assert parse_generate({"text": "abc"}, True, TOK).token_ids == TOK.encode("abc")
    assert parse_generate({"input_ids": [1, 2]}, True, None).text == "1 2"
    with pytest.raises(ClientError) as err:
        parse_generate({"text": "a", "input_ids": [1]}, True, None)
    assert err.value.param == "text"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", "body"),
        (b"{", "body"),
        (b"[]", "body"),
        (b'"s"', "body"),
    ],
)
def test_unreadable_bodies_name_the_body(body: bytes, param: str) -> None:
    with pytest.raises(ClientError) as err:
        parse_json_object(body)
    assert (err.value.status, err.value.param) == (400, param)


@pytest.mark.parametrize(
    ("parser", "data", "param"),
    [
        (parse_completions, {"prompt": None}, "prompt"),
        (parse_completions, {"prompt": []}, "prompt"),
        (parse_completions, {"prompt": [1, "a"]}, "prompt"),
        (parse_completions, {"prompt": "x", "model": 3}, "model"),
        (parse_completions, {"prompt": "x", "stream": 1}, "stream"),
        (parse_chat, {"messages": "hi"}, "messages"),
        (parse_chat, {"messages": [{"content": "no role"}]}, "messages"),
        (parse_generate, {}, "text"),
        (parse_generate, {"text": ""}, "text"),  # SGLang's scheduler fails on it
        (parse_generate, {"text": ["a", ""]}, "text"),
        (parse_generate, {"text": "x", "lora_path": 3}, "lora_path"),
        (parse_completions, {"prompt": "x", "lora_path": [1]}, "lora_path"),
        (parse_completions, {"prompt": [1, 2**63]}, "prompt"),  # beyond the block keys' ints
        (parse_completions, {"prompt": [[-(2**63) - 1], [1]]}, "prompt"),
        (parse_generate, {"input_ids": [2**64]}, "input_ids"),
        (parse_generate, {"input_ids": [[2**70, 1]]}, "input_ids"),
    ],
)
def test_bad_fields_are_named(parser: Parser, data: dict[str, Any], param: str) -> None:
    with pytest.raises(ClientError) as err:
        parser(data, True, TOK, None)
    assert (err.value.status, err.value.param) == (400, param)


@pytest.mark.parametrize(
    ("parser", "data", "param"),
    [
        (parse_completions, {"prompt": "x" * 11}, "prompt"),
        (parse_completions, {"prompt": ["x" * 6, "y" * 6]}, "prompt"),
        (parse_completions, {"prompt": list(range(11))}, "prompt"),
        (parse_chat, {"messages": [{"role": "user", "content": "x" * 11}]}, "messages"),
        (
            parse_chat,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 11}]}]},
            "messages",
        ),
        (parse_generate, {"text": "x" * 11}, "text"),
        (parse_generate, {"input_ids": [list(range(6)), list(range(6))]}, "input_ids"),
        # the whole message counts: its role, and content that is not a string
        (parse_chat, {"messages": [{"role": "r" * 11, "content": ""}]}, "messages"),
        (parse_chat, {"messages": [{"role": "user", "content": {"text": "x" * 11}}]}, "messages"),
        (
            parse_chat,
            {"messages": [{"role": "user", "content": [{"image_url": {"url": "u" * 11}}]}]},
            "messages",
        ),
    ],
)
def test_a_prompt_over_the_limit_is_413_before_tokenizing(
    parser: Parser, data: dict[str, Any], param: str
) -> None:
    class Untouchable:
        def encode(self, text: str) -> list[int]:
            raise AssertionError("tokenized a prompt over the limit")

        def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
            raise AssertionError("tokenized a prompt over the limit")

    with pytest.raises(ClientError) as err:
        parser(data, True, Untouchable(), 10)
    assert (err.value.status, err.value.param) == (413, param)
    assert "limit is 10" in err.value.message
    parser(data, True, TOK, 100)  # within a larger limit it passes


def test_error_bodies_are_openai_shaped() -> None:
    err = ClientError(404, "no such model", param="model", error_type="model_not_found")
    assert err.body() == (
        b'{"error":{"message":"no such model","type":"model_not_found","param":"model","code":404}}'
    )


def test_the_adapter_named_by_lora_path_is_read() -> None:
    assert parse_generate({"text": "x", "lora_path": "sql"}, True, TOK, None).lora_path == "sql"
    batch = parse_generate({"text": ["a", "b"], "lora_path": [None, "sql"]}, True, TOK, None)
    assert batch.lora_path == "sql"  # a batch routes on its first named adapter
    chat = parse_chat({"messages": [{"role": "user", "content": "hi"}]}, True, TOK, None)
    assert chat.lora_path is None
