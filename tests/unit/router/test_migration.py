"""A broken stream's continuation (`tpuserve_router.pipeline.migration`), without a network:
the request that continues it from the text sent, what cannot be continued and why, and the
continuation's usage made the request's."""

from __future__ import annotations

import orjson
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.pipeline import migration
from tpuserve_router.pipeline.migration import (
    Continuation,
    Kept,
    continue_stream,
    corrected_usage,
    why_not,
)

pytestmark = pytest.mark.unit

TOKENS = load_tokenizer()
C, CHAT, GENERATE = "/v1/completions", "/v1/chat/completions", "/generate"
BODY = orjson.dumps({"rid": "a" * 32, "prompt": "Tell me.", "max_tokens": 20, "stream": True})


def events(*texts: str, finish: str | None = None) -> bytes:
    out = b""
    for i, text in enumerate(texts):
        last = finish if i == len(texts) - 1 else None
        choice = {"index": 0, "text": text, "finish_reason": last}
        out += b"data: " + orjson.dumps({"id": "a" * 32, "choices": [choice]}) + b"\n\n"
    return out


def test_a_stream_continues_from_its_prompt_and_the_text_sent() -> None:
    moved = continue_stream(C, BODY, events(" the", " of"), None, TOKENS, "client-id")
    assert isinstance(moved, Continuation)
    data = orjson.loads(moved.body)
    assert data["prompt"] == "Tell me. the of"
    assert data["max_tokens"] == 20 - len(TOKENS.encode(" the of"))
    assert moved.sent_tokens == len(TOKENS.encode(" the of"))
    assert data["rid"] == moved.rid != "a" * 32  # a fresh engine id, the old one aborted
    assert moved.restorer is not None
    assert moved.restorer.whole(f'"{moved.rid}"'.encode()) == b'"client-id"'
    # moved again: from the continuation's own request, the text of both engines counted
    again = continue_stream(C, moved.body, events(" and"), moved, TOKENS, "client-id")
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
            "a completion prompt of token ids is not continued",
        ),
        (
            events(" the"),
            orjson.dumps({"prompt": ["a", "b"], "max_tokens": 20}),
            "only one prompt with one sample is continued",
        ),
        (events(" the"), orjson.dumps({"prompt": "x", "max_tokens": 1}), "the answer had all"),
    ],
)
def test_what_cannot_be_continued_says_why(relayed: bytes, body: bytes, why: str) -> None:
    moved = continue_stream(C, body, relayed, None, TOKENS, None)
    assert isinstance(moved, str), moved
    assert moved.startswith(why)


def test_streams_of_one_prompt_and_sample_of_the_generation_routes_may_move() -> None:
    for route in (C, CHAT, GENERATE):
        assert why_not(route, True, True) == ""
        assert why_not(route, False, True) == "not a stream"
        assert "one sample" in why_not(route, True, False)
    assert why_not("/v1/embeddings", True, True) == "/v1/embeddings's answer is not continued"


def test_a_continuations_usage_is_the_requests() -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    chunk = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    fixed = corrected_usage(chunk, 3)
    event = orjson.loads(fixed.split(b"\n")[0][6:])
    assert event["usage"] == {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}
    assert fixed.endswith(b"data: [DONE]\n\n")
    plain = events(" the")
    assert corrected_usage(plain, 3) is plain  # no usage: untouched, not parsed


def chat_events(*texts: str, role: bool = True, **delta: object) -> bytes:
    out = b""
    if role:
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        out += b"data: " + orjson.dumps({"id": "a" * 32, "choices": [first]}) + b"\n\n"
    for text in texts:
        choice = {"index": 0, "delta": {"content": text, **delta}, "finish_reason": None}
        out += b"data: " + orjson.dumps({"id": "a" * 32, "choices": [choice]}) + b"\n\n"
    return out


CHAT_BODY = orjson.dumps(
    {"rid": "a" * 32, "messages": [{"role": "user", "content": "Tell me."}],
     "max_completion_tokens": 20, "stream": True}
)  # fmt: skip


def test_a_chat_stream_continues_as_the_assistants_final_message() -> None:
    moved = continue_stream(CHAT, CHAT_BODY, chat_events(" the", " of"), None, TOKENS, "c")
    assert isinstance(moved, Continuation)
    data = orjson.loads(moved.body)
    assert data["messages"][-1] == {"role": "assistant", "content": " the of"}
    assert data["continue_final_message"] is True
    assert data["max_completion_tokens"] == 20 - len(TOKENS.encode(" the of"))
    again = continue_stream(CHAT, moved.body, chat_events(" and"), moved, TOKENS, "c")
    assert isinstance(again, Continuation)
    messages = orjson.loads(again.body)["messages"]
    assert messages[1:] == [{"role": "assistant", "content": " the of and"}]  # extended
    assert again.sent_tokens == len(TOKENS.encode(" the of and"))


def test_a_clients_own_assistant_prefix_is_extended() -> None:
    body = orjson.dumps(
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "A:"}],
         "continue_final_message": True, "stream": True}
    )  # fmt: skip
    moved = continue_stream(CHAT, body, chat_events(" yes"), None, TOKENS, None)
    assert isinstance(moved, Continuation)
    assert orjson.loads(moved.body)["messages"][-1]["content"] == "A: yes"


def test_a_chat_stream_with_tool_calls_is_not_continued() -> None:
    relayed = chat_events("x", tool_calls=[{"index": 0, "function": {"name": "f"}}])
    moved = continue_stream(CHAT, CHAT_BODY, relayed, None, TOKENS, None)
    assert moved == "an answer with tool calls or reasoning is not continued"


def generate_events(*chunks: tuple[str, list[int]], cumulative: bool = True) -> bytes:
    out, total = b"", 0
    for text, ids in chunks:
        total = len(ids) if cumulative else total + len(ids)
        meta = {"id": "a" * 32, "finish_reason": None, "prompt_tokens": 4,
                "completion_tokens": total}  # fmt: skip
        event = {"text": text, "output_ids": ids, "meta_info": meta}
        out += b"data: " + orjson.dumps(event) + b"\n\n"
    return out


@pytest.mark.parametrize("cumulative", [True, False])
def test_a_generate_stream_of_ids_continues_from_the_ids_sent(cumulative: bool) -> None:
    body = orjson.dumps(
        {"rid": "a" * 32, "input_ids": [1, 2, 3, 4], "stream": True,
         "sampling_params": {"max_new_tokens": 10, "temperature": 0}}
    )  # fmt: skip
    if cumulative:
        relayed = generate_events((" a", [7]), (" a b", [7, 8]))
    else:
        relayed = generate_events((" a", [7]), (" b", [8]), cumulative=False)
    moved = continue_stream(GENERATE, body, relayed, None, TOKENS, "c")
    assert isinstance(moved, Continuation)
    data = orjson.loads(moved.body)
    assert data["input_ids"] == [1, 2, 3, 4, 7, 8]  # exactly the sequence the engine held
    assert data["sampling_params"] == {"max_new_tokens": 8, "temperature": 0}
    assert (moved.text, moved.sent_ids, moved.sent_tokens) == (" a b", (7, 8), 2)
    # its cumulative chunks get what was sent in front, and the request's counts
    meta = {"id": "x", "finish_reason": None, "prompt_tokens": 6, "completion_tokens": 1}
    chunk = b"data: " + orjson.dumps({"text": " c", "output_ids": [9], "meta_info": meta})
    rejoin = moved.rejoin()
    assert rejoin.feed(chunk[:30]) == b""  # half an event is held
    out = orjson.loads(rejoin.feed(chunk[30:] + b"\n\n")[6:])
    assert (out["text"], out["output_ids"]) == (" a b c", [7, 8, 9])
    assert (out["meta_info"]["prompt_tokens"], out["meta_info"]["completion_tokens"]) == (4, 3)


def test_a_generate_stream_of_text_continues_from_the_text_sent() -> None:
    body = orjson.dumps({"text": "Tell me.", "stream": True})
    moved = continue_stream(GENERATE, body, generate_events((" a", [7])), None, TOKENS, None)
    assert isinstance(moved, Continuation)
    assert orjson.loads(moved.body)["text"] == "Tell me. a"


def test_a_chat_continuations_role_chunk_is_dropped_and_usage_corrected() -> None:
    moved = continue_stream(CHAT, CHAT_BODY, chat_events(" the"), None, TOKENS, None)
    assert isinstance(moved, Continuation)
    usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    tail = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    out = moved.rejoin().feed(chat_events(" of") + tail)
    assert b'"role"' not in out
    assert out.count(b"data: ") == 3  # content, usage, [DONE]
    n = moved.sent_tokens
    assert f'"prompt_tokens":{12 - n},"completion_tokens":{5 + n}'.encode() in out


def test_a_generate_stream_keeps_only_its_last_whole_event() -> None:
    """Its events are cumulative: what the client has is in the last one, so the bytes kept
    stay those of about one event however long the answer (an event split across reads is
    kept whole)."""
    kept = Kept(GENERATE)
    relayed = generate_events((" a", [7]), (" a b", [7, 8]), (" a b c", [7, 8, 9]))
    events_ = [e + b"\n\n" for e in relayed.split(b"\n\n")[:-1]]
    kept.add(events_[0])
    kept.add(events_[1][:20])
    assert kept.bytes() == events_[0] + events_[1][:20]  # the last whole one, and a part
    kept.add(events_[1][20:])
    assert kept.bytes() == events_[1]
    kept.add(events_[2])
    assert kept.bytes() == events_[2]
    body = orjson.dumps({"input_ids": [1, 2], "stream": True})
    moved = continue_stream(GENERATE, body, events_[2], None, TOKENS, None)
    assert isinstance(moved, Continuation)
    assert orjson.loads(moved.body)["input_ids"] == [1, 2, 7, 8, 9]
    chat = Kept(CHAT)  # chat and completions events carry pieces: all are kept
    for event in events_:
        chat.add(event)
    assert chat.bytes() == relayed


def test_an_incremental_generate_stream_whose_history_is_not_kept_says_so() -> None:
    tail = generate_events((" a", [7]), (" b", [8]), cumulative=False).split(b"\n\n")[1]
    body = orjson.dumps({"input_ids": [1, 2], "stream": True})
    moved = continue_stream(GENERATE, body, tail + b"\n\n", None, TOKENS, None)
    assert moved == migration.INCREMENTAL


def test_an_answer_over_what_a_move_keeps_is_not_continued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(migration, "MAX_KEPT_BYTES", 100)
    kept = Kept(CHAT)
    kept.add(b"x" * 60)
    assert kept.bytes() == b"x" * 60
    kept.add(b"x" * 60)
    assert kept.bytes() == "the answer sent is over 100 bytes, more than a move keeps"
    assert (kept.chunks, kept.whole) == ([], [])  # nothing held past the bound


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (CHAT, {"response_format": {"type": "json_object"}}),
        (CHAT, {"tool_choice": "required"}),
        (C, {"regex": "[a-z]+"}),
        (GENERATE, {"sampling_params": {"json_schema": "{}"}}),
    ],
)
def test_a_constrained_answer_is_not_continued(route: str, body: dict[str, object]) -> None:
    """Its grammar would start again from the middle of the answer."""
    if route == CHAT:
        body = {"messages": [{"role": "user", "content": "x"}], **body}
        relayed = chat_events(" the")
    elif route == C:
        body = {"prompt": "x", **body}
        relayed = events(" the")
    else:
        body = {"text": "x", **body}
        relayed = generate_events((" a", [7]))
    moved = continue_stream(route, orjson.dumps(body), relayed, None, TOKENS, None)
    assert moved == migration.CONSTRAINED
