"""SGLang's own engine in one process with no TCP socket (`sglang_tpu.sglang_one_process`), and
its model's forward through the device bridge (`sglang_tpu.sglang_device_bridge`), in the
real-SGLang venv on the CPU: what the TPU lane ran on the chip (issue 71, item 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.real_sglang import REPO, RealSGLang

DRIVER = REPO / "bench" / "sglang_engine_chip.py"
MODELS = REPO / "bench" / "sglang_jax_models.py"
TIMEOUT_S = 300

# an engine's start and run on CPU, once or twice per test: minutes on a loaded machine
pytestmark = [pytest.mark.component, pytest.mark.real_sglang, pytest.mark.timeout(900)]


def _env(real_sglang: RealSGLang) -> dict[str, str]:
    env = real_sglang.environment()
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}"
    return env


@pytest.fixture(scope="module")
def tiny_qwen3(real_sglang: RealSGLang, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    built = subprocess.run(
        [str(real_sglang.python), str(MODELS), "--root", str(root), "--names", "tiny"],
        env=_env(real_sglang),
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return root / "tiny"


def _run(real_sglang: RealSGLang, model: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    argv = [str(real_sglang.python), str(DRIVER), "--model", str(model), "--out", str(out)]
    done = subprocess.run(
        [*argv, "--no-tcp", *extra],
        env=_env(real_sglang),
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert done.returncode == 0, rows[-1:] if rows else done.stderr[-4000:]
    return rows


def _answers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("phase") == "tokens"]


@pytest.fixture(scope="module")
def plain_rows(
    real_sglang: RealSGLang, tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """The driver's rows of the engine's own run: its CPU's tokens, nothing stood in for."""
    return _run(real_sglang, tiny_qwen3, tmp_path_factory.mktemp("plain") / "plain.jsonl")


def test_the_engine_serves_a_shared_prefix_from_its_radix_cache_in_one_process(
    plain_rows: list[dict[str, Any]],
) -> None:
    rows = plain_rows
    answers = _answers(rows)
    assert [a["kind"] for a in answers] == ["first"] + ["shared-prefix"] * 4
    assert answers[0]["cached_tokens"] == 0
    shared = answers[1:]
    assert all(a["cached_tokens"] > 0 for a in shared)
    assert all(a["cached_tokens"] < a["prompt_tokens"] for a in shared)
    assert all(len(a["output_ids"]) == a["completion_tokens"] > 0 for a in answers)
    assert rows[-1]["phase"] == "end"


def test_the_bridge_gives_the_engines_own_tokens_where_the_tpu_machine_lacks_packages(
    real_sglang: RealSGLang, tiny_qwen3: Path, tmp_path: Path, plain_rows: list[dict[str, Any]]
) -> None:
    """The chip's rehearsal: the packages the TPU machine lacks hidden and stood in for, no
    internet socket, the forward through the bridge; tokens and cached tokens are SGLang's
    CPU engine's."""
    plain = _answers(plain_rows)
    rows = _run(
        real_sglang,
        tiny_qwen3,
        tmp_path / "bridge.jsonl",
        "--bridge",
        "--stubs",
        "--hide-installed",
        "--phases",
        "tokens",
        "perf",
        "--batches",
        "2",
        "--perf-new",
        "4",
    )
    start, end = rows[0], rows[-1]
    assert "fastapi" in start["stubbed_modules"]  # hidden here, stood in for
    assert end["phase"] == "end"
    assert end["bridge_steps"] > 0  # every forward went through the bridge
    bridged = _answers(rows)
    assert [a["output_ids"] for a in bridged] == [a["output_ids"] for a in plain]
    assert [a["cached_tokens"] for a in bridged] == [a["cached_tokens"] for a in plain]
    timed = [r for r in rows if r.get("phase") == "perf" and r.get("round") == "timed"]
    assert timed[0]["decode_steps_at_batch"] > 0
    assert timed[0]["decode_ms_median"] > 0
