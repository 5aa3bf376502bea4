"""`tpuserve engine preflight` and `launch` as real processes, the probe script run for real.

SGLang's interpreter here is this one behind a wrapper that puts a stand-in TPU stack first
on its PYTHONPATH: distribution metadata for torch, torch-tpu and libtpu, and `torch` and
`torch_tpu` modules that answer the APIs TorchTPU 0.2.0 answered on a v5e (an accelerator
`tpu`, one device "TPU v5e" of 17179869184 bytes, its eager modes, the `tpu` compile
backend). The launcher's own interpreter never sees them. The chip itself: tests/tpu/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu.preflight import EXIT_PREFLIGHT_FAILED, parse_termination_message
from tests.contract_env import contract_env
from tests.fakes import IMPORT_RAISES, stand_in_tpu_python

pytestmark = pytest.mark.component


def preflight(tmp_path: Path, python: Path, generation: str = "v5e", **extra: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUSERVE_", "TPU_"))}
    env |= contract_env(generation, "1x1", 1, 1, 0)
    env |= {
        "TPUSERVE_SGLANG_PYTHON": str(python),
        "TPUSERVE_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log"),
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "tpuserve", "engine", "preflight", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_stack_and_chip_like_the_v5e_pass(tmp_path: Path) -> None:
    python = stand_in_tpu_python(tmp_path, "0.0.50")
    done = preflight(  # an engine image that keeps the KV pool's writes eager, as ours does
        tmp_path,
        python,
        TPUSERVE_COMPILE_CACHE_DIR=str(tmp_path / "cc"),
        TPUSERVE_SGLANG_KV_WRITES="eager",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["device"]["device_names"] == ["TPU v5e"]
    assert report["device"]["total_memory_bytes"] == [17179869184]
    assert report["versions"]["torch_tpu"] == "0.2.0"
    assert not (tmp_path / "termination-log").exists()


def test_libtpu_0_0_42_1_fails_before_torch_tpu_is_imported(tmp_path: Path) -> None:
    python = stand_in_tpu_python(tmp_path, "0.0.42.1", torch_tpu_module=IMPORT_RAISES)
    done = preflight(tmp_path, python)
    assert done.returncode == EXIT_PREFLIGHT_FAILED
    report = json.loads(done.stdout)
    assert report["reason"] == "TPUStackIncompatible"
    assert report["device"] is None  # the device probe never ran
    parsed = parse_termination_message((tmp_path / "termination-log").read_text())
    assert parsed is not None
    assert parsed[0] == "TPUStackIncompatible"
    assert "libtpu 0.0.42.1" in parsed[1]


def test_an_import_that_raises_is_reported_with_its_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    python = stand_in_tpu_python(tmp_path, "0.0.50", torch_tpu_module=IMPORT_RAISES)
    done = preflight(tmp_path, python)
    assert done.returncode == EXIT_PREFLIGHT_FAILED
    report = json.loads(done.stdout)
    assert report["reason"] == "TPUStackIncompatible"
    assert "set_libtpu_version()" in report["message"]
    assert "Traceback" not in (tmp_path / "termination-log").read_text()


def test_a_v6e_contract_on_the_v5e_stand_in_is_an_accelerator_mismatch(tmp_path: Path) -> None:
    done = preflight(tmp_path, stand_in_tpu_python(tmp_path, "0.0.50"), generation="v6e")
    assert done.returncode == EXIT_PREFLIGHT_FAILED
    assert json.loads(done.stdout)["reason"] == "AcceleratorMismatch"


def test_launch_on_an_interpreter_without_torch_tpu_exits_3_naming_what_is_missing(
    tmp_path: Path,
) -> None:
    python = stand_in_tpu_python(tmp_path, "", with_stack=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUSERVE_", "TPU_"))}
    env |= contract_env("v5e", "1x1", 1, 1, 0, model=str(tmp_path / "model"))
    env |= {
        "TPUSERVE_SGLANG_PYTHON": str(python),
        "TPUSERVE_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tpuserve", "engine", "launch"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_PREFLIGHT_FAILED, done.stderr
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith("TPUStackMissing: ")
    assert "torch-tpu not installed" in message
