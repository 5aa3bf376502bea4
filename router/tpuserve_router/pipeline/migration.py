"""Streams that survive an engine's death (issue 68 item 2; NVIDIA Dynamo's
``--migration-limit``): a completion stream whose engine dies mid-answer continues on another
engine from the tokens already sent.

When a stream the client is reading breaks (its connection reset or closed, its worker gone,
or silent for ``--stream-idle-timeout``: `MIGRATES`), the relay hands the driver a
`Continuation` instead of ending the stream: the same request with the prompt followed by the
text the client already has, ``max_tokens`` less the tokens it already has, and a fresh
engine id. The driver selects again (the dead worker excluded; a pair's mode stays a pair) and
the next relay writes on into the same response: the client sees one unbroken stream, its
``id`` unchanged. An answer's ``usage`` (when the client asked for it) is corrected to the
request's: the continuation's prompt counted the tokens sent before as prompt, so they move
back to the completion. A greedy answer continues as the engine would have (its next token is
a function of the sequence so far); a sampled one continues validly, with other draws.

At most ``--migration-limit`` migrations per request; they spend no retry budget (the engine
is gone). What cannot be migrated ends as before, with an SSE error event, which now says
why: a route whose answer cannot be continued by its prompt (chat, whose continuation needs
the engine to extend the assistant's turn; SGLang's native ``/generate``), a prompt of token
ids, several prompts or samples, ``echo``, a stream cut inside an event, or no migration left.
A non-streamed answer never reached the client: its engine's death is a failed try, retried
from the start under the retry rule (`retry.FREE_RETRIES`: no budget spent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from tpuserve_router.pipeline.request_ids import Restorer, new_rid

MIGRATES: Final = frozenset({"stream_broken", "worker_down", "stream_stalled"})
"""A stream's failures after which its request continues elsewhere: its engine is gone or
silent (not the request's own time running out, nor an answer too large)."""
ROUTES: Final = frozenset({"/v1/completions"})
"""The routes whose answer continues from its prompt followed by the text sent."""


class Encoder(Protocol):
    """What counts the tokens of the text sent (the router's tokenizer, ``--tokenizer``)."""

    def encode(self, text: str) -> Sequence[int]: ...


@dataclass(frozen=True, slots=True)
class Continuation:
    """A stream moved to another engine: what its next try sends, and how that try's answer
    joins what the client already has."""

    body: bytes
    """The request: the prompt followed by the text sent, the tokens left to generate."""
    rid: str | None
    restorer: Restorer | None
    text: str
    """The answer's text the client has, from every engine so far."""
    sent_tokens: int
    """Its tokens: moved from the continuation's prompt back to its completion in ``usage``."""
    migrations: int
    cause: str = ""
    """How the stream broke (what an error event says if it cannot move on)."""


def why_not(route: str, stream: bool, single: bool) -> str:
    """Why a request's stream cannot be migrated, by its route and parsed fields ("": it may
    be; its body is read only if the stream breaks, `continue_stream`)."""
    if not stream:
        return "not a stream"
    if route not in ROUTES:
        return f"{route}'s answer is not continued from its prompt"
    if not single:
        return "only one text prompt with one sample is continued"
    return ""


def _body_why_not(data: dict[str, Any]) -> str:
    """Why a request's body cannot be continued ("": it can)."""
    if not isinstance(data.get("prompt"), str):
        return "only one text prompt with one sample is continued"
    if data.get("echo"):
        return "an echoed prompt is not continued"
    return ""


def continue_stream(
    body: bytes,
    relayed: bytes,
    before: Continuation | None,
    tokens: Encoder,
    theirs: str | None,
) -> Continuation | str:
    """The continuation of a stream whose try sent ``body`` and relayed ``relayed`` (its
    engine's bytes as the client has them; ``before``: the continuation that try was), or
    why there is none. ``theirs`` is the id the client sees (its own, or the first engine
    id)."""
    if relayed and not relayed.endswith(b"\n\n"):
        return "the stream broke inside an event"
    pieces: list[str] = []
    for line in relayed.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            event = orjson.loads(line[6:])
            if "error" in event:
                return "the engine sent an error"
            for choice in event.get("choices") or ():
                if choice.get("finish_reason") is not None:
                    return "the answer had ended"
                pieces.append(choice.get("text") or "")
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return "an event is not JSON"
    new = "".join(pieces)
    sent = new if before is None else before.text + new
    sent_tokens = len(tokens.encode(sent)) if sent else 0
    new_tokens = sent_tokens - (0 if before is None else before.sent_tokens)
    data = orjson.loads(body)
    why = _body_why_not(data)
    if why:
        return why
    data["prompt"] = data["prompt"] + new
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(data.get(field), int):
            left = data[field] - new_tokens
            if left <= 0:
                return "the answer had all its tokens"
            data[field] = left
    rid = restorer = None
    if isinstance(data.get("rid"), str):
        rid = data["rid"] = new_rid()
        if theirs is not None:
            restorer = Restorer([(rid, theirs)])
    migrations = 1 if before is None else before.migrations + 1
    return Continuation(orjson.dumps(data), rid, restorer, sent, sent_tokens, migrations)


def corrected_usage(data: bytes, sent_tokens: int) -> bytes:
    """A continuation's events with their ``usage`` the request's: the tokens sent before it
    moved from its prompt back to its completion."""
    if b'"usage":{' not in data and b'"usage": {' not in data:
        return data
    out: list[bytes] = []
    for line in data.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                event = orjson.loads(line[6:])
                usage = event.get("usage")
                if isinstance(usage, dict):
                    usage["prompt_tokens"] = max(0, usage.get("prompt_tokens", 0) - sent_tokens)
                    usage["completion_tokens"] = usage.get("completion_tokens", 0) + sent_tokens
                    line = b"data: " + orjson.dumps(event)
            except (orjson.JSONDecodeError, TypeError):
                pass
        out.append(line)
    return b"\n".join(out)
