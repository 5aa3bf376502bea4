"""A real SGLang engine and an engine twin configured alike, and the same request sent to both.

The twin takes what the real engine resolved (`/server_info`, `/v1/models`, `/v1/loads`): its
served model name, model path and tokenizer directory, page size, KV pool size, running-request
bound, context length, KV-event topic and whether cached tokens are reported; it runs at
`--time-scale 0` (timings are an intended difference) and binds its KV-event PUB and replay
sockets on free loopback ports.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.component.differential.compare import json_differences, stream_differences
from tests.component.engine.engine_process import EngineProcess, running_engine
from tests.real_sglang import REQUEST_TIMEOUT_SECONDS, RealEngine

SSE_DONE = "[DONE]"
# Greedy and run to the token limit on both: the twin never samples EOS, the real model might.
GREEDY = {"temperature": 0, "ignore_eos": True}
FIRST_ORDINARY_TOKEN, VOCAB_SIZE = 16, 2048  # the tiny model's and the twin's tokenizer


def ids(first: int, count: int) -> list[int]:
    """`count` ordinary token ids from `first` on (the same tokens for both engines)."""
    assert first >= FIRST_ORDINARY_TOKEN
    assert first + count <= VOCAB_SIZE
    return list(range(first, first + count))


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status and JSON body, or the data of every SSE event."""

    status: int
    body: Any = None
    chunks: tuple[Any, ...] | None = None  # streamed: JSON chunks, "[DONE]" as the string
    content_type: str = ""

    @property
    def data_chunks(self) -> list[Any]:
        assert self.chunks is not None, f"not a stream: {self.status} {self.body!r:.200}"
        assert self.chunks[-1:] == (SSE_DONE,), f"the stream does not end with [DONE]: {self}"
        return list(self.chunks[:-1])


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | Mapping[str, Any] | None,
    headers: Mapping[str, str] | None = None,
    streaming: threading.Event | None = None,
) -> Answer:
    """Send one request (a dict body as JSON, bytes as they are) and read the whole answer;
    ``streaming`` is set once the first event of a streamed answer has come."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(
        parts.hostname, parts.port, timeout=REQUEST_TIMEOUT_SECONDS
    )
    try:
        data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
        connection.request(
            method, path, data, {"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        content_type = response.getheader("Content-Type", "")
        if content_type.startswith("text/event-stream"):
            chunks = []
            for line in iter(response.readline, b""):
                if line.startswith(b"data: "):
                    chunks.append(line.decode().removeprefix("data: ").rstrip("\r\n"))
                    if streaming is not None:
                        streaming.set()
            return Answer(
                response.status,
                chunks=tuple(c if c == SSE_DONE else json.loads(c) for c in chunks),
                content_type=content_type,
            )
        raw = response.read().decode()
        try:
            return Answer(response.status, json.loads(raw), content_type=content_type)
        except json.JSONDecodeError:
            return Answer(response.status, raw, content_type=content_type)
    finally:
        connection.close()


def assert_alike(real: Answer, twin: Answer) -> None:
    """Both served the request, with the same answer but for the listed differences."""
    assert (real.status, twin.status) == (200, 200), (real, twin)
    if real.chunks is not None or twin.chunks is not None:
        found = stream_differences(real.data_chunks, twin.data_chunks)
    else:
        found = json_differences(real.body, twin.body)
    assert not found, "\n".join(found)


@dataclass
class EnginePair:
    real: RealEngine
    twin: EngineProcess

    def post(self, path: str, body: bytes | Mapping[str, Any]) -> tuple[Answer, Answer]:
        """The same request to the real engine, then to the twin."""
        return request(self.real.url, "POST", path, body), request(
            self.twin.url, "POST", path, body
        )

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[Answer, Answer]:
        return request(self.real.url, "GET", path, None, headers), request(
            self.twin.url, "GET", path, None, headers
        )


def twin_args(real: RealEngine, *, enable_cache_report: bool) -> list[str]:
    """`tpuserve engine sim` flags that make the twin serve like `real`."""
    info = real.get_json("/server_info")
    (model,) = real.get_json("/v1/models")["data"]
    (load,) = real.get_json("/v1/loads")["loads"]
    assert bool(info["enable_cache_report"]) == enable_cache_report, info["enable_cache_report"]
    return [
        *("--model-path", info["model_path"]),
        *("--served-model-name", info["served_model_name"]),
        *("--tokenizer", info["tokenizer_path"]),
        *("--page-size", str(info["page_size"])),
        *("--cache-tokens", str(info["max_total_num_tokens"])),
        *("--max-running-requests", str(load["max_running_requests"])),
        # the twin's context fits its pool; SGLang checks requests against both anyway
        *("--context-length", str(min(model["max_model_len"], info["max_total_num_tokens"]))),
        *(["--enable-cache-report"] if enable_cache_report else []),
        *("--time-scale", "0"),
        *("--kv-events-endpoint", "tcp://127.0.0.1:*"),
        *("--kv-events-replay-endpoint", "tcp://127.0.0.1:*"),
        *("--kv-events-topic", real.kv_topic),
        "--enable-debug-endpoints",  # /debug/radix_cache, which only the twin serves
    ]


@contextmanager
def twin_like(
    real: RealEngine, *, enable_cache_report: bool, env: Mapping[str, str] | None = None
) -> Iterator[EngineProcess]:
    """A running twin configured like `real` (`env` adds to its environment)."""
    with running_engine(twin_args(real, enable_cache_report=enable_cache_report), env) as twin:
        yield twin


def kv_endpoints(url: str) -> tuple[str, str]:
    """(PUB, replay) endpoints an engine announces in `/server_info`'s `kv_events` block."""
    block = request(url, "GET", "/server_info", None).body["kv_events"]
    host = block["endpoint_host"]
    return (
        f"tcp://{host}:{block['endpoint_port_base']}",
        f"tcp://{host}:{block['replay_endpoint_port_base']}",
    )
