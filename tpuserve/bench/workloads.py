"""Benchmark workloads W0-W8 as seeded generators, and the JSON Lines trace format.

A trace is one request per line::

    {"id": "r1", "t": 0.125, "prompt": "..." | "messages": [...] | "prompt_token_ids": [...],
     "max_tokens": 64, "session": "optional"}

``t`` is the arrival time in seconds from the start. `read_trace` accepts exactly that (and
Mooncake's ``{"timestamp", "input_length", "output_length", "hash_ids"}`` lines, converted as
W7 describes); `write_trace` writes it.

Text is built from words that are one token each in the shared tokenizer (a space and three
lowercase letters, 4 characters), so a character-level router (sglang-router's 4 characters per
token, llm-d's 64-character blocks) and a token-level router see the same prefixes, and the
generators know every prompt's token ids without tokenizing. Chat prompts (W3, W4) are sent as
``messages`` and rendered by the engine's ChatML template, so their token ids carry the
template's special and role tokens.

The workloads, scaled from the published ones (docs/benchmarks.md; reference router.md §7.4):

== ================================================================================================
W0 no sharing (control): unique 1,024-token prompts, output 64
W1 shared-prefix groups: 32 groups x 16 prompts, system prompt 1,024, question 64, output 64, Zipf
W2 tool use: 60 tool templates of 1.5-3k tokens, Zipf 0.9, question 50-150, output 30-120, 1,800
W3 agent chains: 40 episodes x 10-20 steps, each step = previous prompt + action + observation
W4 multi-turn chat: 64 clients x 8 turns, turn = previous context + user 50-200 + assistant 100-300
W5 long-document QA: 24 documents of 6-8k tokens, 8-12 questions each, interleaved, output 32-64
W6 B2B SaaS: 24 customers x 3k context, 5 users each, 600-token queries, output 64-128
W7 trace replay: Mooncake-style hash_ids (512-token blocks), synthetic conversation sessions
W8 adversarial: one prefix takes 80 % of the traffic (W8b: sibling bursts of 16 prompts x 4)
== ================================================================================================

Arrivals are Poisson (sessions start as a Poisson process; turns within a session follow after
a think time). The nominal rate only fixes the order: runners rescale times to the rate asked
for (`rescale_to_rate`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sglang_tpu.tokenizer import Tokenizer, load_tokenizer

NOMINAL_RATE = 10.0
"""Arrivals per second a generator uses before a runner rescales the trace."""


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


def write_trace(requests: Iterable[TraceRequest], path: str | Path) -> int:
    """Write `requests` as JSON Lines; returns how many were written."""
    n = 0
    with open(path, "wb") as f:
        for req in requests:
            f.write(orjson.dumps(req.to_json()) + b"\n")
            n += 1
    return n


def read_trace(path: str | Path, mooncake_block_tokens: int = 512) -> list[TraceRequest]:
    """Read a trace file (our format, or Mooncake's); TraceError names the line and field."""
    out: list[TraceRequest] = []
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as err:
        raise TraceError(f"--trace: cannot read {str(path)!r}: {err.strerror}") from None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise TraceError(f"{path}:{number}: not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise TraceError(f"{path}:{number}: expected a JSON object per line")
        if "hash_ids" in data:
            out.append(_from_mooncake(data, f"{path}:{number}", mooncake_block_tokens))
        else:
            out.append(parse_trace_line(data, f"{path}:{number}"))
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


class _Builder:
    """Collects requests of one generator; knows how to make words and token ids."""

    def __init__(self, seed: int, name: str) -> None:
        self.rng = random.Random(f"{name}:{seed}")
        self.vocab = vocabulary()
        self.requests: list[TraceRequest] = []

    def words(self, n: int) -> list[int]:
        r = self.rng.randrange
        size = Vocabulary.SIZE
        return [r(size) for _ in range(n)]

    def add_prompt(self, t: float, words: list[int], max_tokens: int, session: str | None) -> None:
        rid = f"r{len(self.requests)}"
        req = TraceRequest(rid, t, max_tokens, prompt=self.vocab.text(words), session=session)
        req.token_ids = self.vocab.token_ids(words)
        self.requests.append(req)

    def add_chat(
        self, t: float, messages: list[dict[str, Any]], max_tokens: int, session: str | None
    ) -> None:
        rid = f"r{len(self.requests)}"
        self.requests.append(TraceRequest(rid, t, max_tokens, messages=messages, session=session))

    def done(self, limit: int) -> list[TraceRequest]:
        out = sorted(self.requests, key=lambda r: r.t)[:limit]
        for i, r in enumerate(out):
            r.id = f"r{i}"
        return out


def zipf_picker(rng: random.Random, n: int, alpha: float) -> Callable[[], int]:
    """Draw 0..n-1 with P(k) proportional to 1/(k+1)^alpha (alpha 0: uniform)."""
    weights = [1.0 / (k + 1) ** alpha for k in range(n)]
    cumulative = list(itertools.accumulate(weights))
    total = cumulative[-1]

    def pick() -> int:
        return min(n - 1, bisect.bisect_left(cumulative, rng.random() * total))

    return pick


def _poisson_times(rng: random.Random, n: int, rate: float = NOMINAL_RATE) -> Iterator[float]:
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        yield t


# ---------------------------------------------------------------------------------- generators


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    default_requests: int
    params: Mapping[str, float]
    generate: Callable[[int, int, Mapping[str, float]], list[TraceRequest]]


def _w0(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W0")
    for t in _poisson_times(b.rng, n):
        b.add_prompt(t, b.words(int(p["prompt"])), int(p["output"]), None)
    return b.done(n)


def _w1(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W1")
    groups = int(p["groups"])
    systems = [b.words(int(p["system"])) for _ in range(groups)]
    pick = zipf_picker(b.rng, groups, p["zipf"])
    for t in _poisson_times(b.rng, n):
        g = pick()
        b.add_prompt(t, systems[g] + b.words(int(p["question"])), int(p["output"]), f"g{g}")
    return b.done(n)


def _w2(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W2")
    rng = b.rng
    tools = [
        b.words(rng.randint(int(p["tool_min"]), int(p["tool_max"]))) for _ in range(int(p["tools"]))
    ]
    pick = zipf_picker(rng, len(tools), p["zipf"])
    for t in _poisson_times(rng, n):
        k = pick()
        question = b.words(rng.randint(50, 150))
        b.add_prompt(t, tools[k] + question, rng.randint(30, 120), f"tool{k}")
    return b.done(n)


def _w3(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W3")
    rng = b.rng
    vocab = b.vocab
    system = vocab.text(b.words(int(p["system"])))
    episodes = max(1, math.ceil(n / 15))  # 10-20 steps each, 15 on average
    starts = list(_poisson_times(rng, episodes, NOMINAL_RATE / 15))
    for e, start in enumerate(starts):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": vocab.text(b.words(rng.randint(100, 300)))},
        ]
        t = start
        for _step in range(rng.randint(10, 20)):
            b.add_chat(t, [dict(m) for m in messages], rng.randint(32, 64), f"ep{e}")
            messages.append(
                {"role": "assistant", "content": vocab.text(b.words(rng.randint(20, 60)))}
            )
            messages.append({"role": "user", "content": vocab.text(b.words(rng.randint(100, 300)))})
            t += p["step_seconds"] + rng.expovariate(1.0 / p["think_seconds"])
    return b.done(n)


def _w4(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W4")
    rng = b.rng
    vocab = b.vocab
    turns = int(p["turns"])
    clients = max(1, math.ceil(n / turns))
    system = vocab.text(b.words(int(p["system"])))
    for c, start in enumerate(_poisson_times(rng, clients, NOMINAL_RATE / turns)):
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        t = start
        for _turn in range(turns):
            messages.append({"role": "user", "content": vocab.text(b.words(rng.randint(50, 200)))})
            b.add_chat(t, [dict(m) for m in messages], rng.randint(100, 300), f"c{c}")
            messages.append(
                {"role": "assistant", "content": vocab.text(b.words(rng.randint(100, 300)))}
            )
            t += p["step_seconds"] + rng.expovariate(1.0 / p["think_seconds"])
    return b.done(n)


def _w5(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W5")
    rng = b.rng
    docs = [
        b.words(rng.randint(int(p["doc_min"]), int(p["doc_max"])))
        for _ in range(int(p["documents"]))
    ]
    # 8-12 questions per document, interleaved; more requests asked -> more rounds of them.
    order: list[int] = []
    while len(order) < n:
        round_ = [d for d in range(len(docs)) for _ in range(rng.randint(8, 12))]
        rng.shuffle(round_)
        order.extend(round_)
    for t, d in zip(_poisson_times(rng, n), order, strict=False):
        b.add_prompt(t, docs[d] + b.words(rng.randint(20, 60)), rng.randint(32, 64), f"doc{d}")
    return b.done(n)


def _w6(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W6")
    rng = b.rng
    customers = [b.words(int(p["context"])) for _ in range(int(p["customers"]))]
    users = int(p["users"])
    for t in _poisson_times(rng, n):
        c = rng.randrange(len(customers))
        u = rng.randrange(users)
        query = b.words(int(p["query"]))
        b.add_prompt(t, customers[c] + query, rng.randint(64, 128), f"cust{c}/u{u}")
    return b.done(n)


@functools.lru_cache(maxsize=65536)
def _block_tokens(block_id: int, size: int) -> tuple[int, ...]:
    """The deterministic content of one Mooncake hash-id block (token ids of benchmark words)."""
    rng = random.Random(block_id * 0x9E3779B1 + 7)
    ids = vocabulary().ids
    return tuple([ids[rng.randrange(Vocabulary.SIZE)] for _ in range(size)])


def _from_mooncake(data: Mapping[str, Any], where: str, block: int) -> TraceRequest:
    try:
        hash_ids = [int(h) for h in data["hash_ids"]]
        input_length = int(data["input_length"])
        output_length = int(data["output_length"])
        timestamp_ms = float(data["timestamp"])
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(
            f"{where}: a Mooncake line needs timestamp, input_length, output_length and "
            f"hash_ids ({err})"
        ) from None
    if input_length < 1 or output_length < 1 or not hash_ids:
        raise TraceError(f"{where}: input_length, output_length and hash_ids must be positive")
    ids: list[int] = []
    for h in hash_ids:
        ids.extend(_block_tokens(h, block))
    ids = ids[:input_length] if len(ids) >= input_length else ids
    return TraceRequest(
        str(data.get("id", f"m{int(timestamp_ms)}-{hash_ids[0]}")),
        timestamp_ms / 1000.0, output_length, prompt_token_ids=ids,
    )  # fmt: skip


def _w7(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    """Synthetic Mooncake `conversation`-style sessions: each turn extends its hash_ids."""
    b = _Builder(seed, "W7")
    rng = b.rng
    block = int(p["block"])
    shared = list(range(int(p["shared_blocks"])))
    next_id = itertools.count(len(shared))
    turns_per_session = int(p["turns"])
    sessions = max(1, math.ceil(n / turns_per_session))
    for s, start in enumerate(_poisson_times(rng, sessions, NOMINAL_RATE / turns_per_session)):
        hash_ids = shared[: rng.randint(0, len(shared))]
        t = start
        for _turn in range(turns_per_session):
            hash_ids = hash_ids + [next(next_id) for _ in range(rng.randint(1, 3))]
            input_length = len(hash_ids) * block - rng.randrange(block // 2)
            line = {
                "timestamp": t * 1000.0, "input_length": input_length,
                "output_length": rng.randint(32, 128), "hash_ids": hash_ids,
            }  # fmt: skip
            req = _from_mooncake(line, "W7", block)
            req.session = f"s{s}"
            req.token_ids = req.prompt_token_ids
            b.requests.append(req)
            t += p["step_seconds"] + rng.expovariate(1.0 / p["think_seconds"])
    return b.done(n)


def _w8(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W8")
    rng = b.rng
    hot = b.words(int(p["system"]))
    cold = [b.words(int(p["system"])) for _ in range(int(p["cold_prefixes"]))]
    for t in _poisson_times(rng, n):
        if rng.random() < p["hot_share"]:
            prefix, session = hot, "hot"
        else:
            k = rng.randrange(len(cold))
            prefix, session = cold[k], f"cold{k}"
        b.add_prompt(t, prefix + b.words(int(p["question"])), int(p["output"]), session)
    return b.done(n)


def _w8b(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W8b")
    rng = b.rng
    per_burst = int(p["siblings"]) * int(p["samples"])
    bursts = max(1, math.ceil(n / per_burst))
    for k, start in enumerate(_poisson_times(rng, bursts, NOMINAL_RATE / per_burst)):
        prefix = b.words(int(p["system"]))
        t = start
        for _s in range(int(p["siblings"])):
            words = prefix + b.words(int(p["question"]))
            for _r in range(int(p["samples"])):
                b.add_prompt(t, words, int(p["output"]), f"burst{k}")
                t += 0.001
    return b.done(n)


WORKLOADS: Mapping[str, Workload] = {
    w.name: w
    for w in (
        Workload("W0", "no sharing (control): unique prompts", 2400,
                 {"prompt": 1088, "output": 64}, _w0),
        Workload("W1", "shared-prefix groups", 2400,
                 {"groups": 32, "system": 1024, "question": 64, "output": 64, "zipf": 0.0}, _w1),
        Workload("W2", "tool use (Preble ToolBench)", 2400,
                 {"tools": 60, "tool_min": 1500, "tool_max": 3000, "zipf": 0.9}, _w2),
        Workload("W3", "agent chains", 2400,
                 {"system": 500, "step_seconds": 2.0, "think_seconds": 1.0}, _w3),
        Workload("W4", "multi-turn chat", 2400,
                 {"turns": 8, "system": 200, "step_seconds": 4.0, "think_seconds": 5.0}, _w4),
        Workload("W5", "long-document QA (Preble LooGLE)", 2400,
                 {"documents": 24, "doc_min": 6000, "doc_max": 8000}, _w5),
        Workload("W6", "B2B SaaS (llm-d blog)", 2400,
                 {"customers": 24, "context": 3000, "users": 5, "query": 600}, _w6),
        Workload("W7", "Mooncake-style trace replay (synthetic)", 2400,
                 {"block": 512, "shared_blocks": 4, "turns": 6, "step_seconds": 3.0,
                  "think_seconds": 5.0}, _w7),
        Workload("W8", "adversarial: one prefix takes 80 % of traffic", 2400,
                 {"system": 1024, "question": 64, "output": 64, "hot_share": 0.8,
                  "cold_prefixes": 64}, _w8),
        Workload("W8b", "adversarial: sibling bursts of 16 prompts x 4 samples", 2432,
                 {"system": 1500, "question": 64, "output": 64, "siblings": 16, "samples": 4},
                 _w8b),
    )
}  # fmt: skip


def workload_names() -> list[str]:
    return list(WORKLOADS)


def generate(
    name: str, seed: int = 0, requests: int | None = None, **overrides: float
) -> list[TraceRequest]:
    """The trace of workload `name` (seeded, deterministic); TraceError for bad arguments."""
    workload = WORKLOADS.get(name)
    if workload is None:
        raise TraceError(f"--workload: {name!r} is not allowed; allowed: {', '.join(WORKLOADS)}")
    n = workload.default_requests if requests is None else requests
    if n < 1:
        raise TraceError(f"--requests: {n} is not allowed; allowed: an integer >= 1")
    params = dict(workload.params)
    for key, value in overrides.items():
        if key not in params:
            raise TraceError(
                f"--workload-param {key}: not a parameter of {name}; allowed: {', '.join(params)}"
            )
        params[key] = float(value)
    return workload.generate(seed, n, params)
