"""The twin's SGLang-JAX flavour held against a real SGLang-JAX engine's recorded answers.

CI has no SGLang-JAX (an opt-in source build), so the real engine's answers to a fixed set of
requests are committed (`tests/goldens/sglang_jax_recorded.json`, format 1, written by
`tests.component.differential.sglang_jax_recorded`; re-recorded by the command the file
names). This test starts a twin with ``--flavor sglang-jax`` configured as the recorded engine
was (served name, page size, KV pool, context, cache report), sends it the same requests in
the same order and compares each answer with the recording:

- the status, and the kind of body (JSON, a stream, text);
- JSON answers: the same keys at every level, with values of the same JSON type, except the
  intended differences below; a stream: the same number of kinds of chunks and the last data
  chunk's keys; token counts (``prompt_tokens``, ``completion_tokens``) where the prompt was
  token ids, and ``cached_tokens`` (``meta_info`` and ``usage.prompt_tokens_details``) always;
- ``/get_server_info``: every key the twin has is the engine's, and the keys a router or
  dashboard reads (`SERVER_INFO_KEYS`, `INTERNAL_STATE_KEYS`) are in both;
- ``/metrics``: the same metric families (the engine has no ``sglang:`` series).

Intended differences (the twin's, each with its reason): values of ids, clocks and generated
text; server arguments and internal-state keys the twin does not have (a subset is held); the
twin's own ``tpuserve`` block; error messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.component.engine.engine_process import EngineProcess, running_engine

pytestmark = pytest.mark.component

RECORDING = Path(__file__).resolve().parents[2] / "goldens" / "sglang_jax_recorded.json"
RERECORD = ".venv/bin/python -m tests.component.differential.sglang_jax_recorded --write"
SERVER_INFO_KEYS = frozenset(
    {"model_path", "served_model_name", "page_size", "max_total_num_tokens", "context_length",
     "enable_cache_report", "kv_events_config", "dp_size", "internal_states", "version",
     "status"}
)  # fmt: skip
INTERNAL_STATE_KEYS = frozenset(
    {"waiting_queue_size", "running_batch_size", "available_kv_tokens", "memory_usage",
     "tree_cache_size", "req_to_token_pool_total", "last_gen_throughput"}
)  # fmt: skip
VALUE_FREE_KEYS = frozenset(
    {"id", "created", "text", "output_ids", "content", "e2e_latency", "rid", "model",
     "finish_reason", "matched_stop", "reasoning_content"}
)  # fmt: skip
"""Keys whose values the twin makes its own (ids, clocks, pseudo-text); their types may
differ only between null and a value where the generated text decides (a stop)."""
COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def recording() -> dict[str, Any]:
    if not RECORDING.is_file():
        pytest.skip(
            f"no recording of a real SGLang-JAX engine at {RECORDING}: record it with "
            f"`{RERECORD}` (needs the opt-in build, scripts/build-sglang-jax.sh)"
        )
    data: dict[str, Any] = json.loads(RECORDING.read_text())
    assert data.get("format") == 1, f"{RECORDING}: format {data.get('format')!r}; this test reads 1"
    return data


def twin_args(engine: Mapping[str, Any]) -> list[str]:
    """`tpuserve engine sim` flags that make the twin serve as the recorded engine did."""
    return [
        "--flavor", "sglang-jax",
        "--served-model-name", str(engine["served_model_name"]),
        "--page-size", str(engine["page_size"]),
        "--cache-tokens", str(engine["max_total_tokens"]),
        "--max-running-requests", str(engine["max_running_requests"]),
        "--context-length", str(min(engine["context_length"], engine["max_total_tokens"])),
        *(["--enable-cache-report"] if engine["enable_cache_report"] else []),
        "--time-scale", "0",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return recording()


@pytest.fixture(scope="module")
def twin(recorded: dict[str, Any]) -> Iterator[EngineProcess]:
    with running_engine(twin_args(recorded["engine"])) as engine:
        yield engine


def kind(record: Mapping[str, Any]) -> str:
    return next(k for k in ("json", "sse", "text") if k in record)


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def differences(real: object, twin: object, path: str = "") -> list[str]:
    """Where ``twin`` differs from ``real`` in keys or JSON types (values of `VALUE_FREE_KEYS`
    aside)."""
    key = path.rsplit(".", 1)[-1]
    if key in VALUE_FREE_KEYS:
        return []
    if json_type(real) != json_type(twin):
        return [f"{path or '.'}: {json_type(real)} in the engine, {json_type(twin)} in the twin"]
    if isinstance(real, dict) and isinstance(twin, dict):
        found = [f"{path}.{k}: only in the engine" for k in real.keys() - twin.keys()]
        found += [f"{path}.{k}: only in the twin" for k in twin.keys() - real.keys()]
        for k in real.keys() & twin.keys():
            found += differences(real[k], twin[k], f"{path}.{k}")
        return found
    if isinstance(real, list) and isinstance(twin, list) and real and twin:
        return differences(real[0], twin[0], f"{path}[0]")
    return []


def counts(body: object, path: str = "") -> dict[str, int]:
    """Every token count in an answer, by where it is."""
    found: dict[str, int] = {}
    if isinstance(body, dict):
        for k, v in body.items():
            if k in COUNTS and isinstance(v, int):
                found[f"{path}.{k}"] = v
            found |= counts(v, f"{path}.{k}")
    elif isinstance(body, list):
        for i, v in enumerate(body):
            found |= counts(v, f"{path}[{i}]")
    return found


def metric_families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def replay(twin: EngineProcess, record: Mapping[str, Any]) -> dict[str, Any]:
    from tests.component.differential.engine_pair import request

    body = record["body"]
    if body is None and record["method"] == "POST":
        body = b""
    answer = request(twin.url, record["method"], record["path"], body)
    out: dict[str, Any] = {"status": answer.status, "content_type": answer.content_type}
    if answer.chunks is not None:
        out["sse"] = list(answer.chunks)
    elif isinstance(answer.body, str):
        out["text"] = answer.body
    else:
        out["json"] = answer.body
    return out


def by_ids(record: Mapping[str, Any]) -> bool:
    """The request's prompt was token ids (its counts do not depend on the tokenizer)."""
    body = record["body"] or {}
    return "input_ids" in body or isinstance(body.get("prompt"), list)


def server_info_problems(real: Mapping[str, Any], mine: Mapping[str, Any]) -> list[str]:
    """The twin's keys are the engine's (its own block aside); the keys read are in both."""
    state_real, state_mine = real["internal_states"][0], mine["internal_states"][0]
    extra = (mine.keys() - real.keys() - {"tpuserve"}) | (state_mine.keys() - state_real.keys())
    missing = (SERVER_INFO_KEYS - real.keys()) | (SERVER_INFO_KEYS - mine.keys())
    missing |= (INTERNAL_STATE_KEYS - state_real.keys()) | (INTERNAL_STATE_KEYS - state_mine.keys())
    return [f"the twin's {k!r} is not the engine's" for k in sorted(extra)] + [
        f"{k!r} missing" for k in sorted(missing)
    ]


def answer_problems(record: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """How the twin's answer differs from the recorded one, beyond the intended differences."""
    if got["status"] != record["status"]:
        return [f"status {got['status']}, the engine's {record['status']}"]
    if kind(got) != kind(record):
        return [f"a {kind(got)} answer, the engine's was {kind(record)}"]
    if record["path"] == "/metrics":
        mine, real = metric_families(got["text"]), metric_families(record["text"])
        return [] if mine == real else [f"families {sorted(mine)}, the engine's {sorted(real)}"]
    if record["path"] == "/get_server_info" and record["status"] == 200:
        return server_info_problems(record["json"], got["json"])
    problems: list[str] = []
    if kind(record) == "json":
        if record["status"] < 400:  # error bodies: messages are the twin's own
            problems += differences(record["json"], got["json"])
        real_counts, twin_counts = counts(record["json"]), counts(got["json"])
    elif kind(record) == "sse":
        real_data = [c for c in record["sse"] if c != "[DONE]"]
        twin_data = [c for c in got["sse"] if c != "[DONE]"]
        if got["sse"][-1:] != record["sse"][-1:]:
            problems.append(f"the stream ends {got['sse'][-1:]}, the engine's {record['sse'][-1:]}")
        if real_data and twin_data:
            problems += [f"(last chunk) {d}" for d in differences(real_data[-1], twin_data[-1])]
        real_counts, twin_counts = counts(real_data[-1:]), counts(twin_data[-1:])
    else:
        return []
    for where, value in real_counts.items():
        held = where.endswith("cached_tokens") or by_ids(record)
        if held and twin_counts.get(where) != value:
            problems.append(f"{where} {twin_counts.get(where)}, the engine's {value}")
    return problems


def test_the_twin_answers_every_recorded_exchange_as_sglang_jax_did(
    recorded: dict[str, Any], twin: EngineProcess
) -> None:
    problems = [
        f"{record['name']}: {problem}"
        for record in recorded["exchanges"]
        for problem in answer_problems(record, replay(twin, record))
    ]
    assert not problems, "\n".join(problems)
