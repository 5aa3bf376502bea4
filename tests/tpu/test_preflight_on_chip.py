"""The launcher's pre-flight on a real TPU v5e chip: it passes, and each refusal has its reason.

Every check runs `tpuserve engine preflight --json` as a process (the probe it starts opens the
chip and exits), with the lane's environment: torch, torch-tpu and a libtpu shim on
PYTHONPATH (docs/tpu-lane.md). The messages and reports are recorded in the lane's results.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tpu import chip

RecordProperty = Callable[[str, object], None]  # pytest's record_property fixture

pytestmark = pytest.mark.tpu


def test_the_probe_sees_one_v5e_chip_as_torch_tpu_names_it(
    record_property: RecordProperty,
) -> None:
    facts = chip.probe_device(chip.environment())
    record_property("probe", facts)
    assert facts["error"] is None, facts
    names = [d["name"] for d in facts["devices"]]
    record_property("chip", names[0] if names else None)
    assert facts["accelerator"] == "tpu"
    assert facts["device_count"] == 1
    assert names == ["TPU v5e"]
    assert [d["total_memory"] for d in facts["devices"]] == [chip.V5E_HBM_BYTES]
    assert facts["compile_backend_tpu"] is True
    assert {"DEFER_NEVER", "DEFER_AND_FUSE", "DEFER_NEVER_AND_LAUNCH_BLOCKING"} <= set(
        facts["eager_modes"]
    )


def test_preflight_passes_for_the_contract_of_this_chip(
    tmp_path: Path, record_property: RecordProperty
) -> None:
    env = chip.environment() | chip.contract(TPUSERVE_COMPILE_CACHE_DIR=str(tmp_path / "cc"))
    # An image whose SGLang keeps its KV pool writes eager (else compiled mode is refused on
    # torch-tpu 0.2: the compiled-tokens check, docs/engine-launch.md).
    env["TPUSERVE_SGLANG_KV_WRITES"] = "eager"
    result = chip.preflight(tmp_path, env)
    record_property("report", result.report)
    assert result.returncode == 0, result.stderr
    assert result.report["ok"] is True
    assert result.termination_message is None


def test_a_v6e_contract_on_the_v5e_is_an_accelerator_mismatch(
    tmp_path: Path, record_property: RecordProperty
) -> None:
    result = chip.preflight(tmp_path, chip.environment() | chip.contract("v6e", "1x1"))
    record_property("report", result.report)
    record_property("termination_message", result.termination_message)
    assert result.returncode == 3, result.stderr
    assert result.report["reason"] == "AcceleratorMismatch"
    assert result.termination_message is not None
    assert result.termination_message.startswith("AcceleratorMismatch: ")


def unwritable(tmp_path: Path) -> Path:
    """A directory this user cannot write (a read-only volume); as root, a file instead."""
    volume = tmp_path / "read-only-volume"
    volume.mkdir()
    volume.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(volume, os.W_OK):  # root ignores the mode
        volume.chmod(stat.S_IRWXU)
        volume.rmdir()
        volume.write_text("not a directory")
    return volume


def test_an_unwritable_compile_cache_is_refused_by_name(
    tmp_path: Path, record_property: RecordProperty
) -> None:
    volume = unwritable(tmp_path)
    env = chip.environment() | chip.contract(TPUSERVE_COMPILE_CACHE_DIR=str(volume))
    try:
        result = chip.preflight(tmp_path, env)
    finally:
        if volume.is_dir():
            volume.chmod(stat.S_IRWXU)
    record_property("report", result.report)
    record_property("termination_message", result.termination_message)
    assert result.returncode == 3, result.stderr
    assert result.report["reason"] == "CompileCacheUnwritable"
    assert str(volume) in (result.termination_message or "")


def test_the_machines_libtpu_0_0_42_1_is_refused_without_the_shim(
    tmp_path: Path, record_property: RecordProperty
) -> None:
    env = chip.environment(without_shim=True)
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('libtpu'))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    record_property("machine_libtpu", found)
    if len(found.split(".")) <= 3:
        pytest.skip(f"this machine's libtpu is {found!r}, not a four-part version")
    # The premise: torch_tpu's import itself raises on it.
    imported = subprocess.run(
        [sys.executable, "-c", "import torch, torch_tpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=chip.TIMEOUT_SECONDS,
    )
    record_property("import_stderr_tail", imported.stderr[-1500:])
    assert imported.returncode != 0
    assert "set_libtpu_version" in imported.stderr
    result = chip.preflight(tmp_path, env | chip.contract())
    record_property("report", result.report)
    record_property("termination_message", result.termination_message)
    assert result.returncode == 3, result.stderr
    assert result.report["reason"] == "TPUStackIncompatible"
    assert f"libtpu {found}" in (result.termination_message or "")
    assert "Traceback" not in (result.termination_message or "")
