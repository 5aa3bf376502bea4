"""Token counts are read from OpenAI usage and SGLang meta_info, whole or streamed."""

from __future__ import annotations

import pytest

from tpuserve_router.usage import Usage, usage_from_body, usage_from_stream_tail

pytestmark = pytest.mark.unit


def test_openai_usage_with_cached_tokens() -> None:
    body = (b'{"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3, '
            b'"prompt_tokens_details": {"cached_tokens": 8}}}')  # fmt: skip
    assert usage_from_body(body) == Usage(10, 3, 8)


def test_sglang_meta_info_and_batches() -> None:
    one = b'{"meta_info": {"prompt_tokens": 4, "completion_tokens": 2, "cached_tokens": 1}}'
    assert usage_from_body(one) == Usage(4, 2, 1)
    assert usage_from_body(b"[" + one + b"," + one + b"]") == Usage(8, 4, 2)


def test_missing_or_malformed_usage_is_none_or_zero() -> None:
    assert usage_from_body(b"not json") is None
    assert usage_from_body(b'{"usage": null}') is None
    assert usage_from_body(b'{"usage": {"prompt_tokens": "x"}}') == Usage(0, 0, 0)


def test_stream_tail_finds_the_last_usage_event() -> None:
    tail = (
        b'ta: {"choices": [{"delta": {"content": "x"}}], "usage": null}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert usage_from_stream_tail(tail) == Usage(7, 5, 0)


def test_stream_without_usage_gives_none() -> None:
    assert usage_from_stream_tail(b'data: {"choices": []}\n\ndata: [DONE]\n\n') is None
