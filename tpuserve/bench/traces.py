"""The benchmark's JSON Lines trace format, and the one-token words traces are built from.

A trace is one request per line::

    {"id": "r1", "t": 0.125, "prompt": "..." | "messages": [...] | "prompt_token_ids": [...],
     "max_tokens": 64, "session": "optional"}

``t`` is the arrival time in seconds from the start. `read_trace` accepts exactly that, and
Mooncake's ``{"timestamp", "input_length", "output_length", "hash_ids"}`` lines (`from_mooncake`:
each 512-token block id becomes the same 512 words wherever it appears); every line runs as its
own request whatever its fields. `write_trace` writes our format.

Text is built from words that are one token each in the shared tokenizer (a space and three
lowercase letters, 4 characters), so a character-level router (sglang-router's 4 characters per
token, llm-d's 64-character blocks) and a token-level router see the same prefixes, and the
generators (`workloads`) know every prompt's token ids without tokenizing.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sglang_tpu.tokenizer import Tokenizer, load_tokenizer


class TraceError(ValueError):
    """A trace line or a workload parameter that is not allowed; the message names it."""


@dataclass(slots=True)
class TraceRequest:
    """One request of a trace (exactly one of prompt, messages, prompt_token_ids is set)."""

    id: str
    t: float
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None
    session: str | None = None
    token_ids: list[int] | None = field(default=None, repr=False)
    """The prompt as the engine tokenizes it (template applied); filled lazily (`token_ids_of`)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "t": round(self.t, 6)}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        elif self.messages is not None:
            out["messages"] = self.messages
        else:
            out["prompt_token_ids"] = self.prompt_token_ids
        out["max_tokens"] = self.max_tokens
        if self.session is not None:
            out["session"] = self.session
        return out

    def body(self) -> tuple[str, dict[str, Any]]:
        """The HTTP route and JSON body that send this request (without model/stream)."""
        if self.messages is not None:
            return "/v1/chat/completions", {
                "messages": self.messages,
                "max_tokens": self.max_tokens,
            }
        prompt: Any = self.prompt if self.prompt is not None else self.prompt_token_ids
        return "/v1/completions", {"prompt": prompt, "max_tokens": self.max_tokens}


# ---------------------------------------------------------------------------------- trace I/O


def write_json_lines(rows: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write `rows` as JSON Lines; returns how many were written."""
    n = 0
    with open(path, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")
            n += 1
    return n


def write_trace(requests: Iterable[TraceRequest], path: str | Path) -> int:
    """Write `requests` as JSON Lines in our format; returns how many were written."""
    return write_json_lines((req.to_json() for req in requests), path)


def read_trace(path: str | Path, mooncake_block_tokens: int = 512) -> list[TraceRequest]:
    """Read a trace file (our format, or Mooncake's); TraceError names the line and field.

    Every line becomes its own request: a Mooncake line without an ``id`` is named after its
    line number (``L<n>``), and an id seen on an earlier line gets ``#<n>`` appended, so no
    two requests share an id whatever the lines hold (Mooncake traces repeat timestamps and
    start every prompt with the same block).
    """
    out: list[TraceRequest] = []
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as err:
        raise TraceError(f"--trace: cannot read {str(path)!r}: {err.strerror}") from None
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise TraceError(f"{path}:{number}: not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise TraceError(f"{path}:{number}: expected a JSON object per line")
        where = f"{path}:{number}"
        if is_mooncake_line(data):
            req = from_mooncake(data, where, mooncake_block_tokens, line=number)
        else:
            req = parse_trace_line(data, where)
        if req.id in seen:
            req.id = f"{req.id}#{number}"
        seen.add(req.id)
        out.append(req)
    if not out:
        raise TraceError(f"--trace: {path} holds no requests")
    out.sort(key=lambda r: r.t)
    return out


def parse_trace_line(data: Mapping[str, Any], where: str) -> TraceRequest:
    """One request of our format; TraceError naming `where` and the field otherwise."""
    rid = data.get("id")
    if not isinstance(rid, str) or not rid:
        raise TraceError(f"{where}: id must be a non-empty string, got {rid!r}")
    t = data.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: t must be a number of seconds >= 0, got {t!r}")
    max_tokens = data.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise TraceError(f"{where}: max_tokens must be an integer >= 1, got {max_tokens!r}")
    session = data.get("session")
    if session is not None and not isinstance(session, str):
        raise TraceError(f"{where}: session must be a string when given, got {session!r}")
    given = [k for k in ("prompt", "messages", "prompt_token_ids") if k in data]
    if len(given) != 1:
        raise TraceError(
            f"{where}: exactly one of prompt, messages, prompt_token_ids is allowed, got "
            f"{', '.join(given) or 'none'}"
        )
    req = TraceRequest(rid, float(t), max_tokens, session=session)
    key = given[0]
    value = data[key]
    if key == "prompt":
        if not isinstance(value, str) or not value:
            raise TraceError(f"{where}: prompt must be a non-empty string")
        req.prompt = value
    elif key == "messages":
        if not isinstance(value, list) or not value:
            raise TraceError(f"{where}: messages must be a non-empty list")
        for i, message in enumerate(value):
            if (
                not isinstance(message, dict)
                or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)
            ):
                raise TraceError(
                    f"{where}: messages[{i}] must be an object with string role and content"
                )
        req.messages = value
    else:
        if (
            not isinstance(value, list)
            or not value
            or not all(type(x) is int and x >= 0 for x in value)
        ):
            raise TraceError(f"{where}: prompt_token_ids must be a non-empty list of ids >= 0")
        req.prompt_token_ids = value
    return req


def token_ids_of(req: TraceRequest, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids as the engine sees them (cached on the request)."""
    if req.token_ids is None:
        if req.prompt_token_ids is not None:
            req.token_ids = req.prompt_token_ids
        elif req.messages is not None:
            req.token_ids = tokenizer.encode(tokenizer.apply_chat_template(req.messages))
        else:
            req.token_ids = tokenizer.encode(req.prompt or "")
    return req.token_ids


def rescale_to_rate(requests: Sequence[TraceRequest], rate: float) -> list[TraceRequest]:
    """Copies of `requests` with arrival times scaled so the mean rate is `rate` per second."""
    if rate <= 0 or not math.isfinite(rate):
        raise TraceError(f"--rate: {rate!r} is not allowed; allowed: a number > 0")
    current = mean_rate(requests)
    factor = current / rate if current > 0 else 0.0
    start = requests[0].t if requests else 0.0
    out = []
    for r in requests:
        copy = TraceRequest(
            r.id, (r.t - start) * factor, r.max_tokens, r.prompt, r.messages,
            r.prompt_token_ids, r.session, r.token_ids,
        )  # fmt: skip
        out.append(copy)
    return out


def mean_rate(requests: Sequence[TraceRequest]) -> float:
    """Requests per second over the trace's span (0 when all arrive at once)."""
    if len(requests) < 2:
        return 0.0
    span = requests[-1].t - requests[0].t
    return (len(requests) - 1) / span if span > 0 else 0.0


# ---------------------------------------------------------------------------------- words


class Vocabulary:
    """Words that are one token each: `text` and `ids` of word indices agree exactly."""

    SIZE = 26**3

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        tok = tokenizer or load_tokenizer()
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.words = [" " + "".join(w) for w in itertools.product(letters, repeat=3)]
        ids = tok.encode("".join(self.words))
        if len(ids) != len(self.words):
            raise TraceError(
                f"tokenizer {tok.name}: the benchmark's words are not one token each; "
                "use the built-in tokenizer"
            )
        self.ids = ids
        self.tokenizer = tok

    def text(self, words: Sequence[int]) -> str:
        w = self.words
        return "".join([w[i] for i in words])

    def token_ids(self, words: Sequence[int]) -> list[int]:
        ids = self.ids
        return [ids[i] for i in words]


_VOCAB: Vocabulary | None = None


def vocabulary() -> Vocabulary:
    global _VOCAB
    if _VOCAB is None:
        _VOCAB = Vocabulary()
    return _VOCAB


# ---------------------------------------------------------------------------------- Mooncake


MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
"""A Mooncake trace line (its FAST'25 release): arrival in ms, prompt and output tokens, and
the ids of the prompt's 512-token blocks (equal ids: equal blocks, so shared prefixes)."""


def is_mooncake_line(data: Mapping[str, Any]) -> bool:
    """A Mooncake line (``hash_ids`` or ``input_length``) rather than one of our format."""
    return "hash_ids" in data or "input_length" in data


@functools.lru_cache(maxsize=65536)
def block_words(block_id: int, size: int) -> tuple[int, ...]:
    """The deterministic content of one Mooncake hash-id block, as benchmark word indices."""
    rng = random.Random(block_id * 0x9E3779B1 + 7)
    return tuple([rng.randrange(Vocabulary.SIZE) for _ in range(size)])


def mooncake_words(
    hash_ids: Sequence[int], input_length: int, block: int, private: str
) -> list[int]:
    """A Mooncake prompt as word indices: its blocks' words, cut to ``input_length``; a prompt
    longer than its blocks is padded with words seeded by `private` (no other prompt has them)."""
    words: list[int] = []
    for h in hash_ids:
        words.extend(block_words(h, block))
    if len(words) >= input_length:
        return words[:input_length]
    rng = random.Random(f"mooncake-tail:{private}")
    words.extend(rng.randrange(Vocabulary.SIZE) for _ in range(input_length - len(words)))
    return words


def from_mooncake(
    data: Mapping[str, Any], where: str, block: int, *, line: int, as_text: bool = False
) -> TraceRequest:
    """One Mooncake line as a request: ``prompt_token_ids`` (or word text with `as_text`).

    The id is the line's ``id`` when it is a non-empty string, else ``L<line>``. Only
    ``timestamp`` and ``input_length`` are required; ``hash_ids`` defaults to none (a prompt
    no other request shares) and ``output_length`` 0 is sent as 1 (an engine always produces
    a token).
    """
    try:
        timestamp_ms = float(data["timestamp"])
        input_length = int(data["input_length"])
        output_length = int(data.get("output_length", 1))
        hash_ids = [int(h) for h in data.get("hash_ids") or ()]
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(
            f"{where}: a Mooncake line needs a number timestamp (ms) and input_length, and "
            f"allows output_length and a list of integer hash_ids ({err!r})"
        ) from None
    if not math.isfinite(timestamp_ms) or timestamp_ms < 0:
        raise TraceError(f"{where}: timestamp must be milliseconds >= 0, got {timestamp_ms!r}")
    if input_length < 1:
        raise TraceError(f"{where}: input_length must be >= 1, got {input_length}")
    if output_length < 0:
        raise TraceError(f"{where}: output_length must be >= 0, got {output_length}")
    rid = data.get("id")
    if not isinstance(rid, str) or not rid:
        rid = f"L{line}"
    words = mooncake_words(hash_ids, input_length, block, f"{where}:{rid}")
    vocab = vocabulary()
    req = TraceRequest(rid, timestamp_ms / 1000.0, max(1, output_length))
    req.token_ids = vocab.token_ids(words)
    if as_text:
        req.prompt = vocab.text(words)
    else:
        req.prompt_token_ids = req.token_ids
    return req
