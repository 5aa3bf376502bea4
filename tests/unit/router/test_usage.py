"""Token counts are read from OpenAI usage and SGLang meta_info, whole or streamed."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from tpuserve_router._native import usage_counts
from tpuserve_router.pipeline.usage import (
    Usage,
    usage_from_body,
    usage_from_object,
    usage_from_stream_tail,
)

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


def python_usage(body: bytes) -> tuple[int, int, int] | None:
    """What the answer's usage is, parsed whole in Python (the reference)."""
    try:
        return usage_from_object(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


ANSWERS = [
    {
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": ' a "usage": {} \\ \u00e9 \U0001f600', "logprobs": None,
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 512, "completion_tokens": 8, "total_tokens": 520,
                  "prompt_tokens_details": {"cached_tokens": 480}},
    },
    {"text": "x", "meta_info": {"prompt_tokens": 4, "completion_tokens": 2, "cached_tokens": 1,
                                "e2e_latency": 1.25e-3, "weights": [-0.5, 0, 1e-9]}},
    {"usage": None, "meta_info": {"prompt_tokens": -1, "completion_tokens": 2.5}},
    {"usage": {"prompt_tokens": 2**64, "completion_tokens": 2**64 - 1,
               "prompt_tokens_details": None}},
    {"choices": [], "nested": {"usage": {"prompt_tokens": 9}}, "flags": [True, False, None]},
]  # fmt: skip


def test_the_compiled_reader_reads_common_answers_without_python() -> None:
    for answer in ANSWERS:
        body = json.dumps(answer).encode()  # orjson writes no integer past 64 bits
        assert usage_counts(body) == python_usage(body), body


def test_the_compiled_reader_agrees_with_python_on_mangled_answers() -> None:
    """Every answer cut short, with a byte changed or with bytes spliced in: wherever the
    compiled reader answers, its answer is Python's (anything else it leaves to Python)."""
    rng = random.Random(7)
    bodies = [json.dumps(a, indent=i).encode() for a in ANSWERS for i in (None, 1)]
    alphabet = b' \t\n{}[]:,."\\/-+eE0123456789aflnrstu\x00\x1f\xff'
    read = 0
    for _ in range(20_000):
        body = bytearray(rng.choice(bodies))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(body) + 1)
            what = rng.random()
            if what < 0.2:
                del body[at:]
            elif what < 0.6:
                body[at : at + 1] = bytes([rng.choice(alphabet)])
            elif what < 0.8:
                body[at:at] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            else:
                del body[at : at + rng.randint(1, 4)]
        data = bytes(body)
        expected = python_usage(data)
        assert usage_from_body(data) == expected, data
        try:
            answer = usage_counts(data)
        except ValueError:
            continue
        read += 1
        assert answer == expected, data
    assert read > 2_000  # the mangled answers the compiled reader did read, not only refused
