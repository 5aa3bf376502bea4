"""Streams that survive an engine's death (issue 68 item 2; NVIDIA Dynamo's
``--migration-limit``): a stream whose engine dies mid-answer continues on another engine from
the tokens already sent.

When a stream the client is reading breaks (its connection reset or closed, its worker gone,
or silent for ``--stream-idle-timeout``: `MIGRATES`), the relay hands the driver a
`Continuation` instead of ending the stream: the same request continued from what the client
already has, its token limit less the tokens it already has, and a fresh engine id. The driver
selects again (the dead worker excluded; a pair's mode stays a pair) and the next relay writes
on into the same response through the continuation's `Rejoin`: the client sees one unbroken
stream, its ``id`` unchanged. Per route (`ROUTES`):

- ``/v1/completions``: the prompt followed by the text sent.
- ``/v1/chat/completions``: the messages followed by an assistant message holding the text
  sent, with ``continue_final_message`` (SGLang 0.5.23's ``serving_chat``: it renders the
  messages before it with the generation prompt, exactly the first engine's prompt, and
  appends the tokens of the prefix; the continuation's role-only first chunk is dropped). A
  stream that sent tool calls or reasoning is not continued.
- ``/generate``: token ids in (``input_ids``), the ids in followed by the ``output_ids`` sent,
  exactly the sequence the dead engine held; text in, the text followed by the text sent. Its
  chunks' cumulative ``text`` and ``output_ids`` get what was sent in front.

An answer's usage (``usage``, ``meta_info``) is corrected to the request's: the continuation's
prompt counted the tokens sent before as prompt, so they move back to the completion. A greedy
answer continues as the engine would have (its next token is a function of the sequence so
far): exact for token ids; for text, as long as the text sent tokenizes back to the tokens
generated (true of the twin's tokenizer; a BPE tokenizer may merge differently across the
seam). A sampled one continues validly, with other draws.

At most ``--migration-limit`` migrations per request; they spend no retry budget (the engine
is gone). What cannot be migrated ends with an SSE error event that says why: several prompts
or samples, a completion prompt of token ids, ``echo``, a stream cut inside an event, tool
calls or reasoning in a chat answer, a constrained answer (its grammar would start again
mid-answer: ``response_format``, ``regex``, ``ebnf``, ``json_schema``, a forced tool), an
incremental ``/generate`` stream (only its last event
is kept: SGLang's default events are cumulative), an answer over `MAX_KEPT_BYTES`, or no
migration left. A
non-streamed answer never reached the client: its engine's death is a failed try, retried from
the start under the retry rule (`retry.FREE_RETRIES`: no budget spent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from tpuserve_router.pipeline.request_ids import Restorer, new_rid

MIGRATES: Final = frozenset({"stream_broken", "worker_down", "stream_stalled"})
"""A stream's failures after which its request continues elsewhere: its engine is gone or
silent (not the request's own time running out, nor an answer too large)."""
COMPLETIONS: Final = "/v1/completions"
CHAT: Final = "/v1/chat/completions"
GENERATE: Final = "/generate"
ROUTES: Final = frozenset({COMPLETIONS, CHAT, GENERATE})
"""The routes whose answer a continuation can extend."""
MAX_KEPT_BYTES: Final = 16 << 20
"""The most of a stream's bytes kept for its continuation (`Kept`): a longer answer (some
80,000 tokens of chat events) is not continued, so what the router holds stays bounded."""
ONE_PROMPT: Final = "only one prompt with one sample is continued"
CONSTRAINED: Final = "a constrained answer (a grammar, a schema, a forced tool) is not continued"
GRAMMARS: Final = ("json_schema", "regex", "ebnf", "structural_tag")
"""SGLang's constrained-decoding parameters: a continuation's grammar would start again."""
INCREMENTAL: Final = (
    "an incremental /generate stream (--incremental-streaming-output) is not continued"
)
TOKEN_PROMPT: Final = (
    "a completion prompt of token ids is not continued (its stream carries no output ids; "
    "/generate's does)"
)


class Encoder(Protocol):
    """What counts the tokens of the text sent (the router's tokenizer, ``--tokenizer``)."""

    def encode(self, text: str) -> Sequence[int]: ...


@dataclass(frozen=True, slots=True)
class Continuation:
    """A stream moved to another engine: what its next try sends, and how that try's answer
    joins what the client already has."""

    body: bytes
    """The request: continued from what was sent, the tokens left to generate."""
    rid: str | None
    restorer: Restorer | None
    text: str
    """The answer's text the client has, from every engine so far."""
    sent_tokens: int
    """Its tokens: moved from the continuation's prompt back to its completion in usage."""
    migrations: int
    cause: str = ""
    """How the stream broke (what an error event says if it cannot move on)."""
    route: str = COMPLETIONS
    sent_ids: tuple[int, ...] = field(default=())
    """``/generate``: the output ids the client has (put in front of the continuation's)."""

    def rejoin(self) -> Rejoin:
        """What makes the continuation's bytes follow on from those the client has."""
        return Rejoin(self)


class Kept:
    """What a stream that may move keeps of the bytes the client has: all of them
    (completions and chat events carry the text piece by piece), or for ``/generate`` only
    from the last whole event on (its events are cumulative: the last holds the whole answer),
    at most `MAX_KEPT_BYTES`. One append per chunk; nothing is parsed unless the stream
    breaks."""

    __slots__ = ("chunks", "over", "size", "tail_only", "whole")

    def __init__(self, route: str) -> None:
        self.chunks: list[bytes] = []
        """Since the last whole event (all of them unless ``tail_only``)."""
        self.whole: list[bytes] = []
        """``tail_only``: the chunks that ended with the last whole event."""
        self.size = 0
        self.tail_only = route == GENERATE
        self.over = False

    def add(self, data: bytes) -> None:
        if self.over:
            return
        self.chunks.append(data)
        self.size += len(data)
        if self.tail_only and data.endswith(b"\n\n"):  # the events so far are whole
            self.whole, self.chunks = self.chunks, []
            self.size = sum(map(len, self.whole))  # about one event: the next replaces it
        if self.size > MAX_KEPT_BYTES:
            self.over = True
            self.chunks.clear()
            self.whole = []

    def bytes(self) -> bytes | str:
        """The bytes kept, or why they cannot continue the stream."""
        if self.over:
            return f"the answer sent is over {MAX_KEPT_BYTES} bytes, more than a move keeps"
        return b"".join(self.whole) + b"".join(self.chunks)


def why_not(route: str, stream: bool, single: bool) -> str:
    """Why a request's stream cannot be migrated, by its route and parsed fields ("": it may
    be; its body is read only if the stream breaks, `continue_stream`)."""
    if not stream:
        return "not a stream"
    if route not in ROUTES:
        return f"{route}'s answer is not continued"
    if not single:
        return ONE_PROMPT
    return ""


@dataclass(slots=True)
class _Sent:
    """What one engine's stream sent, read from its events."""

    text: str = ""
    ids: list[int] | None = None
    completion_tokens: int | None = None
    """``/generate``: the tokens its last event counted."""


def _read_events(route: str, relayed: bytes) -> _Sent | str:
    """What the relayed events sent (text, and ``/generate``'s ids), or why they cannot be
    continued."""
    sent = _Sent()
    pieces: list[str] = []
    for line in relayed.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            event = orjson.loads(line[6:])
            if "error" in event:
                return "the engine sent an error"
            if route == GENERATE:
                why = _generate_event(event, sent, pieces)
            else:
                why = _openai_event(route, event, pieces)
            if why:
                return why
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return "an event is not JSON"
    if route != GENERATE:
        sent.text = "".join(pieces)
    return sent


def _openai_event(route: str, event: dict[str, Any], pieces: list[str]) -> str:
    for choice in event.get("choices") or ():
        if choice.get("finish_reason") is not None:
            return "the answer had ended"
        if route == COMPLETIONS:
            pieces.append(choice.get("text") or "")
            continue
        delta = choice.get("delta") or {}
        if delta.get("tool_calls") or delta.get("reasoning_content"):
            return "an answer with tool calls or reasoning is not continued"
        pieces.append(delta.get("content") or "")
    return ""


def _generate_event(event: dict[str, Any], sent: _Sent, pieces: list[str]) -> str:
    """One ``/generate`` event: cumulative (SGLang's default: its text and ids are the whole
    answer so far) or incremental (``--incremental-streaming-output``: ids fewer than the
    completion tokens), told apart by its ids and its ``meta_info``."""
    meta = event.get("meta_info") or {}
    if meta.get("finish_reason") is not None:
        return "the answer had ended"
    text, ids = event.get("text"), event.get("output_ids")
    if not isinstance(text, str) or not isinstance(ids, list):
        return "a /generate event without its text and output_ids is not continued"
    sent.completion_tokens = meta.get("completion_tokens")
    if len(ids) == meta.get("completion_tokens", len(ids)):  # cumulative
        pieces[:] = [text]
        sent.ids = list(ids)
    else:
        pieces.append(text)
        sent.ids = (sent.ids or []) + ids
    sent.text = "".join(pieces)
    return ""


def continue_stream(
    route: str,
    body: bytes,
    relayed: bytes,
    before: Continuation | None,
    tokens: Encoder,
    theirs: str | None,
) -> Continuation | str:
    """The continuation of a ``route`` stream whose try sent ``body`` and relayed
    ``relayed`` (its engine's bytes as the client has them; ``before``: the continuation that
    try was), or why there is none. ``theirs`` is the id the client sees (its own, or the
    first engine id)."""
    if relayed and not relayed.endswith(b"\n\n"):
        return "the stream broke inside an event"
    read = _read_events(route, relayed)
    if isinstance(read, str):
        return read
    new = read.text
    sent = new if before is None else before.text + new
    data = orjson.loads(body)
    if route == GENERATE:
        new_ids = read.ids or []
        if read.completion_tokens not in (None, len(new_ids)):  # history not kept
            return INCREMENTAL
        sent_ids = (before.sent_ids if before is not None else ()) + tuple(new_ids)
        new_tokens = len(new_ids)
        sent_tokens = len(sent_ids)
        why = _continue_generate(data, new, new_ids, new_tokens)
    else:
        sent_ids = ()
        sent_tokens = len(tokens.encode(sent)) if sent else 0
        new_tokens = sent_tokens - (0 if before is None else before.sent_tokens)
        why = _continue_openai(route, data, new, new_tokens)
    if why:
        return why
    rid = restorer = None
    if isinstance(data.get("rid"), str):
        rid = data["rid"] = new_rid()
        if theirs is not None:
            restorer = Restorer([(rid, theirs)])
    migrations = 1 if before is None else before.migrations + 1
    return Continuation(
        orjson.dumps(data), rid, restorer, sent, sent_tokens, migrations, route=route,
        sent_ids=sent_ids,
    )  # fmt: skip


def _constrained(data: dict[str, Any]) -> bool:
    """Whether an OpenAI request's answer follows a grammar (``response_format`` other than
    text, SGLang's ``regex``/``ebnf``/``json_schema``, a forced tool): its continuation's
    grammar would start again, from the middle of the answer."""
    fmt = data.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return True
    if data.get("tool_choice") not in (None, "auto", "none"):
        return True
    return any(data.get(name) is not None for name in GRAMMARS)


def _continue_openai(route: str, data: dict[str, Any], new: str, new_tokens: int) -> str:
    """``data`` (an OpenAI request) continued by ``new``, or why it cannot be."""
    if _constrained(data):
        return CONSTRAINED
    if route == COMPLETIONS:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            return TOKEN_PROMPT
        if not isinstance(prompt, str):
            return ONE_PROMPT
        if data.get("echo"):
            return "an echoed prompt is not continued"
        data["prompt"] = data["prompt"] + new
    else:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            return ONE_PROMPT
        last = messages[-1]
        extends = (
            data.get("continue_final_message") is True
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        )
        if extends:  # the client's own prefix, or the one a migration before made
            messages[-1] = dict(last, content=last["content"] + new)
        else:
            messages.append({"role": "assistant", "content": new})
            data["continue_final_message"] = True
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(data.get(name), int):
            left = data[name] - new_tokens
            if left <= 0:
                return "the answer had all its tokens"
            data[name] = left
    return ""


def _continue_generate(data: dict[str, Any], new: str, new_ids: list[int], new_tokens: int) -> str:
    """``data`` (a ``/generate`` request) continued by what was sent, or why it cannot be."""
    ids, text = data.get("input_ids"), data.get("text")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        data["input_ids"] = ids + new_ids
    elif isinstance(text, str) and ids is None:
        data["text"] = text + new
    else:
        return ONE_PROMPT
    params = data.get("sampling_params")
    if isinstance(params, dict) and any(params.get(name) is not None for name in GRAMMARS):
        return CONSTRAINED
    if isinstance(params, dict) and isinstance(params.get("max_new_tokens"), int):
        left = params["max_new_tokens"] - new_tokens
        if left <= 0:
            return "the answer had all its tokens"
        data["sampling_params"] = dict(params, max_new_tokens=left)
    return ""


class Rejoin:
    """A continuation's answer rewritten to follow on from what the client has: its usage
    the request's, a chat continuation's role-only first chunk dropped, a ``/generate``
    chunk's cumulative text and ids with what was sent in front. Events split across reads
    are held until whole (`feed`; `flush` at the end). Only a migrated stream pays for it."""

    __slots__ = ("held", "moved", "opened")

    def __init__(self, moved: Continuation) -> None:
        self.moved = moved
        self.held = b""
        self.opened = False  # a chat continuation's role chunk went by

    def feed(self, data: bytes) -> bytes:
        """The whole events of ``data`` (and of what was held), rewritten."""
        data = self.held + data
        end = data.rfind(b"\n\n")
        if end < 0:
            self.held = data
            return b""
        self.held = data[end + 2 :]
        return self._events(data[: end + 2])

    def flush(self) -> bytes:
        """What was held (the answer's end): passed on as it is."""
        held, self.held = self.held, b""
        return held

    def _events(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for block in data.split(b"\n\n")[:-1]:
            if block.startswith(b"data: {"):
                try:
                    rewritten = self._event(orjson.loads(block[6:]))
                except (orjson.JSONDecodeError, TypeError, AttributeError, ValueError):
                    rewritten = block[6:]
                if rewritten is None:  # dropped
                    continue
                block = b"data: " + rewritten
            out.append(block + b"\n\n")
        return b"".join(out)

    def _event(self, event: dict[str, Any]) -> bytes | None:
        moved = self.moved
        n = moved.sent_tokens
        if moved.route == GENERATE:
            meta = event.get("meta_info")
            if isinstance(meta, dict):
                ids = event.get("output_ids")
                if isinstance(ids, list) and len(ids) == meta.get("completion_tokens", len(ids)):
                    event["output_ids"] = [*moved.sent_ids, *ids]  # cumulative
                    if isinstance(event.get("text"), str):
                        event["text"] = moved.text + event["text"]
                _move(meta, "prompt_tokens", "completion_tokens", n)
            return orjson.dumps(event)
        if moved.route == CHAT and not self.opened:
            choices = event.get("choices")
            if isinstance(choices, list) and len(choices) == 1:
                choice = choices[0]
                delta = choice.get("delta") or {}
                if (
                    delta.get("role")
                    and not delta.get("content")
                    and not choice.get("finish_reason")
                ):
                    self.opened = True  # the continuation's role-only first chunk
                    return None
        usage = event.get("usage")
        if isinstance(usage, dict):
            _move(usage, "prompt_tokens", "completion_tokens", n)
        return orjson.dumps(event)


def _move(counts: dict[str, Any], prompt: str, completion: str, n: int) -> None:
    """``n`` tokens counted as prompt moved back to the completion."""
    if isinstance(counts.get(prompt), int):
        counts[prompt] = max(0, counts[prompt] - n)
    if isinstance(counts.get(completion), int):
        counts[completion] = counts[completion] + n


def corrected_usage(data: bytes, sent_tokens: int) -> bytes:
    """A completion continuation's events with their ``usage`` the request's: the tokens sent
    before it moved from its prompt back to its completion (events whole in ``data``)."""
    if b'"usage":{' not in data and b'"usage": {' not in data:
        return data
    moved = Continuation(b"", None, None, "", sent_tokens, 1)
    return Rejoin(moved).feed(data)
