"""TPUSERVE_DEVICE=cpu: the launcher plans real SGLang on this machine's CPU from the contract."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import launch, sglang_flags
from sglang_tpu.contract.launch_contract import LaunchContract
from tests.contract_env import contract_env

pytestmark = pytest.mark.unit

CPU = contract_env("v6e", "1x1", chips_per_host=1, model="/models/tiny-llama") | {
    "TPUSERVE_DEVICE": "cpu",
    "TPUSERVE_BIND_HOST": "127.0.0.1",
    "TPUSERVE_HTTP_PORT": "31000",
    "TPUSERVE_KV_EVENTS_PORT": "31001",
    "TPUSERVE_CPU_KERNEL_SHIM_DIR": "/opt/tpuserve/cpu-shim",
}


def dry_run(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert launch.launch(env, dry_run=True) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def value(command: list[str], name: str) -> str:
    """The last value of `name` (SGLang's parser keeps the last one)."""
    at = len(command) - 1 - command[::-1].index(name)
    return command[at + 1]


def test_dry_run_prints_the_cpu_command_and_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = dry_run(CPU, capsys)
    env, command = out["env"], out["command"]
    assert command[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert value(command, "--device") == "cpu"
    assert value(command, "--tp-size") == "1"
    assert value(command, "--model-path") == "/models/tiny-llama"
    assert (value(command, "--host"), value(command, "--port")) == ("127.0.0.1", "31000")
    assert {"--enable-metrics", "--enable-cache-report", "--sleep-on-idle"} <= set(command)
    for flag in sglang_flags.CPU_FLAGS:
        if flag.set_from:
            assert value(command, flag.name) == flag.set_from
    assert json.loads(value(command, "--kv-events-config")) == {
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:31001",
        "bind": True,
    }
    assert "--enable-torch-compile" not in command
    assert env == {**sglang_flags.CPU_ENV, "PYTHONPATH": "/opt/tpuserve/cpu-shim"}
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_cpu_plans_no_torch_tpu_environment() -> None:
    plan = launch.plan(LaunchContract.from_env(CPU))
    assert not [name for name in plan.env if name.startswith(("TPU_", "TORCH_TPU_"))]
    assert plan.directories == []


def test_extra_arguments_come_last_so_they_override_the_cpu_defaults() -> None:
    env = {**CPU, "TPUSERVE_SGLANG_EXTRA_ARGS": "--max-total-tokens 4096 --skip-server-warmup"}
    command = launch.plan(LaunchContract.from_env(env)).command
    assert value(command, "--max-total-tokens") == "4096"
    assert command[-1] == "--skip-server-warmup"


def test_the_python_that_runs_sglang_can_be_named() -> None:
    env = {**CPU, "TPUSERVE_SGLANG_PYTHON": "/opt/sglang-venv/bin/python"}
    assert launch.plan(LaunchContract.from_env(env)).command[0] == "/opt/sglang-venv/bin/python"
    tpu = {
        k: v for k, v in CPU.items() if k not in ("TPUSERVE_DEVICE", "TPUSERVE_CPU_KERNEL_SHIM_DIR")
    }
    assert launch.plan(LaunchContract.from_env(tpu)).command[0] == "python3"


def test_cpu_runs_on_one_host_only(capsys: pytest.CaptureFixture[str]) -> None:
    env = {**CPU, "TPUSERVE_TPU_TOPOLOGY": "4x4", "TPUSERVE_HOSTS": "4"}
    env |= {"TPUSERVE_CHIPS_PER_HOST": "4", "TPUSERVE_WORKER_HOSTNAMES": "a,b,c,d"}
    assert launch.launch(env, dry_run=True) == 2
    err = capsys.readouterr().err
    assert "TPUSERVE_HOSTS='4'" in err
    assert "TPUSERVE_DEVICE=cpu runs on one host" in err


def test_the_shim_directory_defaults_to_the_installed_shim_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {k: v for k, v in CPU.items() if k != "TPUSERVE_CPU_KERNEL_SHIM_DIR"}
    contract = LaunchContract.from_env(env)
    monkeypatch.setattr(launch, "CPU_SHIM_PACKAGE", "sglang_tpu.sim")  # any installed package
    assert launch.plan(contract).env["PYTHONPATH"] == str(Path(launch.__file__).parent / "sim")
    monkeypatch.setattr(launch, "CPU_SHIM_PACKAGE", "sglang_tpu.no_such_package")
    assert "PYTHONPATH" not in launch.plan(contract).env


def test_the_shim_goes_before_an_inherited_pythonpath() -> None:
    contract = LaunchContract.from_env(CPU)
    plan = launch.plan(contract)
    env = launch.server_env(contract, plan, {"PYTHONPATH": "/inherited", "HOME": "/tmp"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/opt/tpuserve/cpu-shim", "/inherited"])
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["HOME"] == "/tmp"
