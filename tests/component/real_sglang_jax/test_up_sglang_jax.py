"""`tpuserve up --engine sglang-jax` serves a real SGLang-JAX engine (the opt-in build) behind
the router as it serves twins: it prints the URLs, drives a load through the router, and stops
everything when the load is done (on a busy 2-core machine, its two ~1,000-token chats took
minutes the first time: their batch shapes compile; JAX's compilation cache keeps them).

Without the build, it refuses at once and says how to build it (that half runs everywhere)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.real_sglang_jax import SGLangJax

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
UP = [sys.executable, "-c", ENTRY, "up", "--engine", "sglang-jax", "--port", "0", "--json"]
UP_TIMEOUT_SECONDS = 600  # start (~1 min), then ~1,000-token chat prompts compile and run on CPU


def run_up(args: list[str], env: dict[str, str], timeout_seconds: float) -> tuple[int, str, str]:
    """Run `tpuserve up`; past the timeout, SIGTERM it (it stops its engines and router in
    order: a SIGKILL would leave them running) before the test fails."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"tpuserve up ran past {timeout_seconds:g} s:\n{stderr[-4000:]}")
    return proc.returncode, stdout, stderr


@pytest.mark.component
@pytest.mark.real_sglang_jax
@pytest.mark.timeout(UP_TIMEOUT_SECONDS + 180)
def test_up_serves_a_real_sglang_jax_engine_and_drives_a_load(
    real_sglang_jax: SGLangJax,
) -> None:
    env = {**os.environ, "TPUSERVE_SGLANG_JAX_PYTHON": str(real_sglang_jax.python),
           "TPUSERVE_SGLANG_JAX_MODEL": str(real_sglang_jax.model)}  # fmt: skip
    code, stdout, stderr = run_up(
        [*UP, "--load", "shared-prefix", "--rate", "1", "--requests", "2"], env, UP_TIMEOUT_SECONDS
    )
    assert code == 0, stderr[-4000:]
    seen: list[dict[str, Any]] = [json.loads(line) for line in stdout.splitlines()]
    ready = seen[0]
    assert ready["event"] == "ready"
    assert ready["model"] == "tiny-qwen3"
    assert len(ready["workers"]) == 1
    assert seen[-1] == {"event": "stopped", "exit_code": 0, "exited": []}
    last_load = [e for e in seen if e["event"] == "load"][-1]
    print(f"\nMEASURED tpuserve up --engine sglang-jax, 2 shared-prefix requests: {last_load}")
    assert (last_load["sent"], last_load["done"], last_load["failed"]) == (2, 2, 0)
    assert last_load["output_tokens_per_second"] > 0


@pytest.mark.component
def test_without_the_build_up_refuses_and_names_the_script(tmp_path: Path) -> None:
    env = {**os.environ, "TPUSERVE_CACHE": str(tmp_path)}
    env.pop("TPUSERVE_SGLANG_JAX_PYTHON", None)
    env.pop("TPUSERVE_SGLANG_JAX_MODEL", None)
    result = subprocess.run(UP, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2
    assert "scripts/build-sglang-jax.sh" in result.stderr
    assert str(tmp_path / "sglang-jax") in result.stderr
    (line,) = result.stdout.splitlines()
    assert json.loads(line)["event"] == "error"
