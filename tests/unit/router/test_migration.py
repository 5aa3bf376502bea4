"""A broken stream's continuation (`tpuserve_router.pipeline.migration`), without a network:
the request that continues it from the text sent, what cannot be continued and why, and the
continuation's usage made the request's."""

from __future__ import annotations

import orjson
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.pipeline.migration import (
    Continuation,
    continue_stream,
    corrected_usage,
    why_not,
)

pytestmark = pytest.mark.unit

TOKENS = load_tokenizer()
BODY = orjson.dumps({"rid": "a" * 32, "prompt": "Tell me.", "max_tokens": 20, "stream": True})


def events(*texts: str, finish: str | None = None) -> bytes:
    out = b""
    for i, text in enumerate(texts):
        last = finish if i == len(texts) - 1 else None
        choice = {"index": 0, "text": text, "finish_reason": last}
        out += b"data: " + orjson.dumps({"id": "a" * 32, "choices": [choice]}) + b"\n\n"
    return out


def test_a_stream_continues_from_its_prompt_and_the_text_sent() -> None:
    moved = continue_stream(BODY, events(" the", " of"), None, TOKENS, "client-id")
    assert isinstance(moved, Continuation)
    data = orjson.loads(moved.body)
    assert data["prompt"] == "Tell me. the of"
    assert data["max_tokens"] == 20 - len(TOKENS.encode(" the of"))
    assert moved.sent_tokens == len(TOKENS.encode(" the of"))
    assert data["rid"] == moved.rid != "a" * 32  # a fresh engine id, the old one aborted
    assert moved.restorer is not None
    assert moved.restorer.whole(f'"{moved.rid}"'.encode()) == b'"client-id"'
    # moved again: from the continuation's own request, the text of both engines counted
    again = continue_stream(moved.body, events(" and"), moved, TOKENS, "client-id")
    assert isinstance(again, Continuation)
    assert orjson.loads(again.body)["prompt"] == "Tell me. the of and"
    assert again.text == " the of and"
    assert again.sent_tokens == len(TOKENS.encode(" the of and"))
    assert again.migrations == 2


@pytest.mark.parametrize(
    ("relayed", "body", "why"),
    [
        (events(" the")[:-1], BODY, "the stream broke inside an event"),
        (events(" the", finish="length"), BODY, "the answer had ended"),
        (b'data: {"error": {"message": "x"}}\n\n', BODY, "the engine sent an error"),
        (b"data: not json\n\n", BODY, "an event is not JSON"),
        (
            events(" the"),
            orjson.dumps({"prompt": "x", "max_tokens": 20, "echo": True}),
            "an echoed prompt is not continued",
        ),
        (
            events(" the"),
            orjson.dumps({"prompt": [1, 2, 3], "max_tokens": 20}),
            "only one text prompt with one sample is continued",
        ),
        (events(" the"), orjson.dumps({"prompt": "x", "max_tokens": 1}), "the answer had all"),
    ],
)
def test_what_cannot_be_continued_says_why(relayed: bytes, body: bytes, why: str) -> None:
    moved = continue_stream(body, relayed, None, TOKENS, None)
    assert isinstance(moved, str)
    assert moved.startswith(why)


def test_only_one_completion_stream_may_move() -> None:
    assert why_not("/v1/completions", True, True) == ""
    assert why_not("/v1/completions", False, True) == "not a stream"
    assert "not continued from its prompt" in why_not("/v1/chat/completions", True, True)
    assert "one sample" in why_not("/v1/completions", True, False)


def test_a_continuations_usage_is_the_requests() -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    chunk = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    fixed = corrected_usage(chunk, 3)
    event = orjson.loads(fixed.split(b"\n")[0][6:])
    assert event["usage"] == {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}
    assert fixed.endswith(b"data: [DONE]\n\n")
    plain = events(" the")
    assert corrected_usage(plain, 3) is plain  # no usage: untouched, not parsed
