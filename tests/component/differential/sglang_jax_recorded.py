"""Recorded answers of a real SGLang-JAX engine: the fixed requests, the file, how to re-record.

CI has no SGLang-JAX (an opt-in source build, `scripts/build-sglang-jax.sh`), so the twin's
SGLang-JAX flavour is held against answers a real engine gave once, committed as
`tests/goldens/sglang_jax_recorded.json` and re-recorded by one command (needs the build):

    .venv/bin/python -m tests.component.differential.sglang_jax_recorded --write

(`--check` records again and fails where a status, the kind of answer or a token count differs
from the committed file: what a real engine answers now, against what the twin is held to;
`tests/component/real_sglang_jax/test_recording_is_current.py` runs it with the build.)

The file (format 1), one JSON object:

- ``format``: 1; ``rerecord``: the command above.
- ``engine``: ``commit`` (SGLang-JAX's source commit), ``version`` (what it reports),
  ``jax``, ``python``, ``device`` ("cpu"), ``args`` (its launch flags after
  ``-m sgl_jax.launch_server``, the model directory written as ``<model>`` and the port as
  ``<port>``), ``served_model_name``, ``page_size``, ``max_total_tokens``,
  ``max_running_requests``, ``context_length``, ``enable_cache_report``. The model directory
  is written ``<model>`` wherever an answer names it (`scrub`).
- ``model``: ``builder`` ("sglang_tpu.tiny_qwen3") and its ``spec`` (the tokenizer is
  `sglang_tpu.tiny_model`'s BPE: the twin is given the same one).
- ``exchanges``: in the order they were sent to one freshly started engine (order matters:
  cached tokens come from the requests before). Each: ``name``, ``method``, ``path``,
  ``body`` (the JSON sent, or null), ``status``, ``content_type``, and one of ``json`` (the
  answer parsed), ``sse`` (a stream: each ``data:`` payload parsed, the final ``"[DONE]"`` as
  that string) or ``text`` (any other body, `/metrics` for one).

Token ids in the requests are ordinary ids of the tiny tokenizer (16 and up); generation is
greedy with ``ignore_eos``, so answers run to ``max_new_tokens`` on the twin and the real engine
alike. What the twin is expected to match (keys, types, statuses, token counts, cached tokens)
and what differs on purpose (generated text, ids, clocks) is the comparing test's business.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
RECORDING = REPO / "tests" / "goldens" / "sglang_jax_recorded.json"
FORMAT = 1
RERECORD = ".venv/bin/python -m tests.component.differential.sglang_jax_recorded --write"
GREEDY = {"temperature": 0, "ignore_eos": True}
MODEL = "tiny-qwen3"


def ids(first: int, count: int) -> list[int]:
    """`count` ordinary token ids from `first` on."""
    return list(range(first, first + count))


@dataclass(frozen=True)
class Exchange:
    """One request of the fixed set."""

    name: str
    method: str
    path: str
    body: Mapping[str, Any] | None = None


def _chat(content: str, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": content},
        ],
        "max_tokens": 4,
        "stream": stream,
        **GREEDY,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _completion(prompt: str | list[int], *, stream: bool, max_tokens: int = 4) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
        **GREEDY,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _generate(input_ids: list[int], max_new_tokens: int = 3, **extra: Any) -> dict[str, Any]:
    return {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, **GREEDY},
            **extra}  # fmt: skip


SHARED_PREFIX = ids(200, 64)  # four pages of 16

EXCHANGES: tuple[Exchange, ...] = (
    Exchange("health", "GET", "/health"),
    Exchange("models", "GET", "/v1/models"),
    Exchange("model_info", "GET", "/get_model_info"),
    Exchange("server_info", "GET", "/get_server_info"),
    Exchange("server_info_current_route", "GET", "/server_info"),
    Exchange("get_load", "GET", "/get_load"),
    Exchange("loads", "GET", "/v1/loads"),
    Exchange("generate_ids", "POST", "/generate", _generate(ids(100, 40))),
    Exchange("generate_ids_again", "POST", "/generate", _generate(ids(100, 40))),
    Exchange(
        "generate_text_stream",
        "POST",
        "/generate",
        {
            "text": "The differential twin streams.",
            "stream": True,
            "sampling_params": {"max_new_tokens": 4, **GREEDY},
        },
    ),
    Exchange("completion", "POST", "/v1/completions", _completion("Compare it.", stream=False)),
    Exchange(
        "completion_stream", "POST", "/v1/completions", _completion("Stream it.", stream=True)
    ),
    Exchange("chat", "POST", "/v1/chat/completions", _chat("Compare the chats.", stream=False)),
    Exchange("chat_stream", "POST", "/v1/chat/completions", _chat("Stream a chat.", stream=True)),
    Exchange(
        "completion_shared_prefix_first",
        "POST",
        "/v1/completions",
        _completion(SHARED_PREFIX + ids(600, 8), stream=False),
    ),
    Exchange(
        "completion_shared_prefix_second",
        "POST",
        "/v1/completions",
        _completion(SHARED_PREFIX + ids(700, 8), stream=False),
    ),
    Exchange(
        "generate_too_long",
        "POST",
        "/generate",
        _generate(ids(16, 2000), max_new_tokens=100),
    ),
    Exchange("flush_cache", "POST", "/flush_cache"),
    Exchange("generate_ids_after_flush", "POST", "/generate", _generate(ids(100, 40))),
    Exchange("metrics", "GET", "/metrics"),
)


def answer_record(
    exchange: Exchange, status: int, content_type: str, answer: Any
) -> dict[str, Any]:
    """One exchange as the file holds it (`answer`: an engine_pair.Answer)."""
    record: dict[str, Any] = {
        "name": exchange.name,
        "method": exchange.method,
        "path": exchange.path,
        "body": dict(exchange.body) if exchange.body is not None else None,
        "status": status,
        "content_type": content_type,
    }
    if answer.chunks is not None:
        record["sse"] = list(answer.chunks)
    elif isinstance(answer.body, str):
        record["text"] = answer.body
    else:
        record["json"] = answer.body
    return record


def send_all(url: str, exchanges: Sequence[Exchange] = EXCHANGES) -> list[dict[str, Any]]:
    """Send the fixed requests in order to the engine at `url`; their records."""
    from tests.component.differential.engine_pair import request

    records = []
    for exchange in exchanges:
        body = exchange.body if exchange.body is not None else (b"" if exchange.method == "POST"
                                                                else None)  # fmt: skip
        answer = request(url, exchange.method, exchange.path, body)
        records.append(answer_record(exchange, answer.status, answer.content_type, answer))
    return records


def load() -> dict[str, Any]:
    """The committed recording."""
    data: dict[str, Any] = json.loads(RECORDING.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{RECORDING}: format {data.get('format')!r}, this code reads {FORMAT}")
    return data


def scrub(value: Any, model: str) -> Any:
    """`value` with the model directory (a path on the recording machine) written `<model>`."""
    if isinstance(value, str):
        return value.replace(model, "<model>")
    if isinstance(value, list):
        return [scrub(v, model) for v in value]
    if isinstance(value, dict):
        return {k: scrub(v, model) for k, v in value.items()}
    return value


def _portable_args(argv: Sequence[str], model: Path, port: int) -> list[str]:
    args = list(argv[argv.index("sgl_jax.launch_server") + 1 :])
    return ["<model>" if a == str(model) else "<port>" if a == str(port) else a for a in args]


def record() -> dict[str, Any]:
    """Start a real engine (the opt-in build), send the fixed requests, return the recording."""
    from sglang_tpu.tiny_qwen3 import TinyQwen3Spec
    from tests import real_sglang_jax as rj

    installed = rj.SGLangJax.discover()
    with tempfile.TemporaryDirectory(prefix="sglang-jax-record-") as run_dir:
        engine = rj.start_engine(installed, Path(run_dir), name="recorded")
        try:
            info = engine.get_json("/get_server_info")
            versions = _versions(installed)
            records = send_all(engine.url)
        finally:
            engine.stop()
    return {
        "format": FORMAT,
        "rerecord": RERECORD,
        "engine": {
            "commit": installed.commit,
            "version": info.get("version"),
            **versions,
            "device": "cpu",
            "args": _portable_args(engine.argv, installed.model, engine.port),
            "served_model_name": info["served_model_name"],
            "page_size": info["page_size"],
            "max_total_tokens": info["max_total_tokens"],
            "max_running_requests": info["max_running_requests"],
            "context_length": info["context_length"],
            "enable_cache_report": info["enable_cache_report"],
        },
        "model": {"builder": "sglang_tpu.tiny_qwen3", "spec": dataclasses.asdict(TinyQwen3Spec())},
        "exchanges": scrub(records, str(installed.model)),
    }


def _versions(installed: Any) -> dict[str, str]:
    import subprocess

    out = subprocess.run(
        [str(installed.python), "-c",
         "import jax, platform; print(jax.__version__, platform.python_version())"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    return {"jax": out[0], "python": out[1], "recorded_on": platform.machine()}


COUNT_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def _counts(value: Any, path: str = "") -> dict[str, Any]:
    """Every token count in an answer by its path (`meta_info.cached_tokens`, ...)."""
    found: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key in COUNT_KEYS:
                found[where] = item
            found |= _counts(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found |= _counts(item, f"{path}[{i}]")
    return found


def summary(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must not change between two recordings of an exchange: its status, the kind of
    body, and its token counts (the last chunk's for a stream): greedy on the same model and
    requests, they are the engine's, not the run's."""
    kind = next(k for k in ("json", "sse", "text") if k in record)
    body = record.get("json")
    if kind == "sse":
        chunks = [c for c in record["sse"] if isinstance(c, dict)]
        body = chunks[-1] if chunks else None
    return record["status"], kind, _counts(body)


def differences(
    committed: Sequence[Mapping[str, Any]], fresh: Sequence[Mapping[str, Any]]
) -> list[str]:
    """How a fresh recording differs from the committed one, one line per exchange."""
    if [r["name"] for r in committed] != [r["name"] for r in fresh]:
        return [f"exchanges: committed {[r['name'] for r in committed]}, "
                f"now {[r['name'] for r in fresh]}"]  # fmt: skip
    return [
        f"{old['name']}: committed {summary(old)}, now {summary(new)}"
        for old, new in zip(committed, fresh, strict=True)
        if summary(old) != summary(new)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.component.differential.sglang_jax_recorded", description=__doc__
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"record into {RECORDING}")
    mode.add_argument(
        "--check", action="store_true", help="record and compare statuses and token counts"
    )
    args = parser.parse_args(argv)
    recorded = record()
    if args.write:
        RECORDING.write_text(json.dumps(recorded, indent=1, sort_keys=False) + "\n")
        print(f"wrote {RECORDING} ({len(recorded['exchanges'])} exchanges)")
        return 0
    found = differences(load()["exchanges"], recorded["exchanges"])
    if found:
        print(f"{RECORDING} is stale; re-record: {RERECORD}\n" + "\n".join(found))
        return 1
    print(f"{RECORDING}: the engine answers with the recorded statuses and token counts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
