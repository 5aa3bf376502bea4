"""The engine twin's cold start over real HTTP: the port opens after pull, weights and compile,
`/health` answers 503 during warmup and 200 after; `/metrics` and `/server_info` report the
phases and the compile cache's answer. A cold compile writes the twin's entry under its
keyed directory, so the next start with the same key is a hit and one with another is a miss.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sglang_tpu import metric_names
from sglang_tpu.cold_start import PHASES, SIM_CACHE_ENTRY
from tests.component.engine.engine_process import ENTRY, start_engine
from tests.waiting import eventually
from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component

# Modelled seconds times the scale: compile (cold) 2 s and warmup 2 s of real time, long
# enough to see each state; the weights (16 GB of an 8B model at 1.2 GB/s) take 0.13 s.
SCALE = ["--startup-time-scale", "0.01", "--compile-cold-seconds", "200"]
SLOW_WARMUP = ["--warmup-seconds", "200", "--compile-warm-seconds", "5"]
MODEL = ["--tpu", "v6e", "--topology", "2x4", "--model-profile", "qwen3-8b"]


def health(url: str) -> str:
    """What `/health` answers now: "refused" (port closed), or the status code and body."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return f"{response.status}"
    except urllib.error.HTTPError as err:
        return f"{err.code} {err.read().decode()}"
    except (ConnectionError, urllib.error.URLError):
        return "refused"


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        data: dict[str, object] = json.loads(response.read())
        return data


def cold_start_of(url: str) -> dict[str, object]:
    info = get_json(f"{url}/server_info")
    block = info["tpuserve"]
    assert isinstance(block, dict)
    cold: dict[str, object] = block["cold_start"]
    return cold


def metric_lines(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith("tpuserve_engine_")]


def test_health_is_refused_then_503_while_warming_up_then_200() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), *MODEL, *SCALE, *SLOW_WARMUP]
    seen: list[str] = []

    def up() -> bool:
        answer = health(url)
        if not seen or seen[-1] != answer:
            seen.append(answer)
        return answer == "200"

    command = [sys.executable, "-c", ENTRY, "engine", "sim", *args]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually(up, what="the twin up", timeout_seconds=60, interval_seconds=0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert seen[0] == "refused"  # weights and compile: no HTTP server yet, as SGLang
    assert "503 starting" in seen  # warmup: SGLang's ServerStatus.Starting
    assert seen.index("503 starting") < seen.index("200")


def test_a_cold_compile_writes_the_cache_and_the_next_start_with_the_key_hits(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "v6e-2x4" / "qwen3-8b" / "engine-a"
    fast = ["--startup-time-scale", "0.0001", *MODEL, "--compile-cache-dir", str(cache)]

    def start(key: str, log: str) -> tuple[dict[str, object], list[str]]:
        engine = start_engine([*fast, "--compile-cache-key", key], log=tmp_path / log)
        try:
            return cold_start_of(engine.url), metric_lines(engine.url)
        finally:
            engine.terminate()

    first, first_metrics = start("v6e-2x4/qwen3-8b/engine-a", "first.log")
    assert first["compile_cache"] == {"result": "miss", "key": "v6e-2x4/qwen3-8b/engine-a"}
    assert json.loads((cache / SIM_CACHE_ENTRY).read_text()) == {"key": "v6e-2x4/qwen3-8b/engine-a"}
    phases = first["phases"]
    assert isinstance(phases, dict)
    assert set(phases) == set(PHASES)
    miss = f'{metric_names.COMPILE_CACHE_TOTAL}{{result="miss"}} 1.0'
    assert miss in first_metrics
    for phase in PHASES:
        assert any(
            line.startswith(f'{metric_names.COLD_START_SECONDS}{{phase="{phase}"}}')
            for line in first_metrics
        )

    second, second_metrics = start("v6e-2x4/qwen3-8b/engine-a", "second.log")
    assert second["compile_cache"] == {"result": "hit", "key": "v6e-2x4/qwen3-8b/engine-a"}
    assert f'{metric_names.COMPILE_CACHE_TOTAL}{{result="hit"}} 1.0' in second_metrics
    log = (tmp_path / "second.log").read_text()
    assert "cold start: compile took" in log
    assert "compile cache hit" in log
    assert all(f"cold start: {phase} took" in log for phase in PHASES)

    other, _ = start("v6e-2x4/qwen3-8b/engine-b", "other.log")
    assert other["compile_cache"] == {"result": "miss", "key": "v6e-2x4/qwen3-8b/engine-b"}
