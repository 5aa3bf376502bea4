"""Record an engine's KV events on a list of prompts and compare two engines' recordings.

Every payload is decoded with SGLang's own `KVEventBatch` from the pinned wheel
(`tests.sglang_kv_events`): a payload SGLang refuses is a difference, not a crash. Events are
compared after naming every block hash by the page it stands for (request i's page k, with
the request's output tokens as the engine generated them), so blocks of prompt tokens must
carry the very same hashes on both engines, and blocks holding generated tokens (which differ
on purpose) must sit at the same place in the same events.

A recording starts with a flush (`/flush_cache`, which SGLang answers with
`AllBlocksCleared`): flushing until that event arrives on the SUB socket proves the
subscription is live; the scenario then ends with another flush. The same batches are then
fetched again from the replay socket, whose frames (0.5.23: `[b"", topic, seq, payload]`,
ended by `[b"", b"", -1, b""]`) are part of what is compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from sglang_tpu.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    KVEventDecodeError,
    block_hashes,
    decode_batch,
)
from tests.component.differential.engine_pair import GREEDY, Answer, kv_endpoints, request
from tests.real_sglang import flush_cache_when_idle
from tests.sglang_kv_events import as_fields, batch_decoder
from tests.waiting import eventually

POLL_MS = 200
QUIET_MS = 1000  # no more message for this long: the recording is complete


@dataclass
class Message:
    """One PUB message: its frames and what SGLang's decoder made of the payload."""

    frames: list[bytes]
    batch: Any = None  # SGLang's KVEventBatch
    error: str | None = None  # why SGLang's decoder refused it


@dataclass
class Recording:
    """What one engine published during a scenario and the answers it gave."""

    messages: list[Message] = field(default_factory=list)
    replay: list[list[bytes]] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    sequences: list[list[int]] = field(default_factory=list)  # prompt + output, per request


def decode(frames: list[bytes]) -> Message:
    try:
        return Message(frames, batch=batch_decoder().decode(frames[-1]))
    except msgspec.DecodeError as err:  # ValidationError included
        return Message(frames, error=str(err))


def _cleared(message: Message) -> bool:
    """The batch clears every block. Read with tpuserve's decoder (it takes either wire), so
    the flushes that bound a recording are found even where SGLang's decoder refuses."""
    try:
        batch = decode_batch(message.frames[-1])
    except KVEventDecodeError:
        return False
    return any(isinstance(e, AllBlocksCleared) for e in batch.events)


@contextlib.contextmanager
def _socket(context: zmq.Context[zmq.Socket[bytes]], kind: int, endpoint: str) -> Iterator[Any]:
    sock = context.socket(kind)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close(linger=0)


Prompt = tuple[list[int], int]  # token ids, max_new_tokens


def compare_engines(real_url: str, twin_url: str, prompts: Sequence[Prompt], topic: str,
                    page_size: int) -> list[str]:  # fmt: skip
    """Record both engines on the same prompts (greedy `/generate`, one after another, each
    to its token limit) and say how the twin's KV events differ."""
    real, twin = (record(url, topic, prompts) for url in (real_url, twin_url))
    return differences(real, twin, topic, page_size)


def record(url: str, topic: str, prompts: Sequence[Prompt]) -> Recording:
    """Send `prompts` to the engine at `url` between two flushes and record the KV events it
    published, at the endpoints its `/server_info` announces."""
    pub_endpoint, replay_endpoint = kv_endpoints(url)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with _socket(context, zmq.SUB, pub_endpoint) as sub:
            sub.setsockopt(zmq.SUBSCRIBE, topic.encode())

            def flushed_and_seen() -> bool:
                flush_cache_when_idle(url, what=url)
                while sub.poll(QUIET_MS):
                    if _cleared(decode(sub.recv_multipart())):
                        return True
                return False

            eventually(flushed_and_seen, what=f"{pub_endpoint} to publish a flush")
            while sub.poll(POLL_MS):  # anything left from before the recording
                sub.recv_multipart()
            out = Recording()
            for prompt, max_new_tokens in prompts:
                sampling = {"max_new_tokens": max_new_tokens, **GREEDY}
                body = {"input_ids": prompt, "sampling_params": sampling}
                answer = request(url, "POST", "/generate", body)
                assert answer.status == 200, answer
                out.answers.append(answer)
                out.sequences.append(prompt + list(answer.body["output_ids"]))
            flush_cache_when_idle(url, what=url)
            while not (out.messages and _cleared(out.messages[-1])) and sub.poll(30_000):
                out.messages.append(decode(sub.recv_multipart()))
            while sub.poll(QUIET_MS):
                out.messages.append(decode(sub.recv_multipart()))
        if out.messages:
            out.replay = replay_from(replay_endpoint, int.from_bytes(out.messages[0].frames[1]))
        return out
    finally:
        context.destroy(linger=0)


def replay_from(endpoint: str, start_seq: int) -> list[list[bytes]]:
    """Every reply of the replay socket to a DEALER asking from `start_seq` on, end marker
    last (frames as the DEALER receives them)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    replies = []
    try:
        with _socket(context, zmq.DEALER, endpoint) as dealer:
            dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
            while dealer.poll(30_000):
                frames = dealer.recv_multipart()
                replies.append(frames)
                if len(frames) >= 2 and int.from_bytes(frames[-2], "big", signed=True) == END_SEQ:
                    return replies
        raise AssertionError(f"{endpoint}: no replay end marker after {len(replies)} replies")
    finally:
        context.destroy(linger=0)


def page_names(sequences: Sequence[list[int]], page_size: int) -> dict[int, str]:
    """Block hash -> "r<i>p<k>": the first request i (in scenario order) whose sequence (prompt
    and output) has that block as page k."""
    names: dict[int, str] = {}
    for i, tokens in enumerate(sequences):
        for k, digest in enumerate(block_hashes(tokens, page_size)):
            names.setdefault(digest, f"r{i}p{k}")
    return names


def named_events(rec: Recording, page_size: int) -> list[tuple[str, dict[str, Any]]]:
    """Every decoded event, block hashes and generated token ids replaced by page names."""
    names = page_names(rec.sequences, page_size)
    pages = {
        tuple(tokens[k * page_size : (k + 1) * page_size]): f"r{i}p{k}"
        for i, tokens in reversed(list(enumerate(rec.sequences)))
        for k in reversed(range(len(tokens) // page_size))
    }
    out = []
    for message in rec.messages:
        for event in message.batch.events if message.batch is not None else ():
            kind, fields = as_fields(event)
            if "block_hashes" in fields:
                fields["block_hashes"] = [names.get(h, h) for h in fields["block_hashes"]]
            if fields.get("parent_block_hash") is not None:
                fields["parent_block_hash"] = names.get(
                    fields["parent_block_hash"], fields["parent_block_hash"]
                )
            if "token_ids" in fields:
                tokens = fields["token_ids"]
                fields["token_ids"] = [
                    pages.get(tuple(tokens[s : s + page_size]), tokens[s : s + page_size])
                    for s in range(0, len(tokens), page_size)
                ]
            out.append((kind, fields))
    return out


def differences(real: Recording, twin: Recording, topic: str, page_size: int) -> list[str]:
    """How the twin's KV events differ from the real engine's on the same scenario."""
    found: list[str] = []
    for name, rec in (("real", real), ("twin", twin)):
        if not rec.messages:
            found.append(f"{name}: published nothing")
        for m in rec.messages:
            seq = int.from_bytes(m.frames[1], "big") if len(m.frames) > 1 else None
            if len(m.frames) != 3 or m.frames[0] != topic.encode() or len(m.frames[1]) != 8:
                found.append(f"{name}: PUB frames are not [topic, 8-byte seq, payload]: {m.frames}")
            if m.error is not None:
                found.append(f"{name}: seq {seq}: SGLang's decoder refuses the batch: {m.error}")
        seqs = [int.from_bytes(m.frames[1], "big") for m in rec.messages if len(m.frames) == 3]
        if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            found.append(f"{name}: sequence numbers are not consecutive: {seqs}")
    ranks = {
        name: sorted({m.batch.attn_dp_rank for m in rec.messages if m.batch is not None})
        for name, rec in (("real", real), ("twin", twin))
    }
    if ranks["real"] != ranks["twin"]:
        found.append(f"attn_dp_rank of the batches: real {ranks['real']}, twin {ranks['twin']}")
    real_events, twin_events = named_events(real, page_size), named_events(twin, page_size)
    if real_events != twin_events:
        found.append(
            "events differ (block hashes named by page):\n  real: "
            + "\n        ".join(map(repr, real_events))
            + "\n  twin: "
            + "\n        ".join(map(repr, twin_events))
        )
    found += _replay_differences(real, twin)
    return found


def _replay_differences(real: Recording, twin: Recording) -> list[str]:
    found = []
    shapes = {}
    for name, rec in (("real", real), ("twin", twin)):
        live = {m.frames[1]: m.frames[2] for m in rec.messages if len(m.frames) == 3}
        replayed = {f[-2]: f[-1] for f in rec.replay[:-1]}
        if replayed != live:
            found.append(f"{name}: the replay does not give back the published batches")
        shapes[name] = (
            sorted({len(f) for f in rec.replay[:-1]}),
            [len(f) for f in rec.replay[-1:]],
        )
    if shapes["real"] != shapes["twin"]:
        found.append(
            "replay frames differ (frames per batch, frames of the end marker): "
            f"real {shapes['real']}, twin {shapes['twin']}"
        )
    ends = [rec.replay[-1] if rec.replay else None for rec in (real, twin)]
    if ends[0] != ends[1]:
        found.append(f"replay end markers differ: real {ends[0]}, twin {ends[1]}")
    return found
