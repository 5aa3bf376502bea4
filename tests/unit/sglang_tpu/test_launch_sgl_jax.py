"""TPUSERVE_ENGINE=sglang-jax: the launcher plans SGLang-JAX's server from the contract.

Every flag the launcher puts on the command line is held against SGLang-JAX's own flags
(`sgl_jax_server_args`, generated from its ServerArgs), and extra arguments are refused by
name when SGLang-JAX has no such flag, when the launcher owns it or when it carries a secret.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import launch, sgl_jax_cpu_shim, sgl_jax_flags
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.problems import ContractError
from sglang_tpu.sgl_jax_server_args import SERVER_FLAGS
from tests.contract_env import contract_env

pytestmark = pytest.mark.unit

HOSTS = ("jax-0.jax", "jax-1.jax", "jax-2.jax", "jax-3.jax")
KNOWN = {name for flag in SERVER_FLAGS for name in flag.names}


def v5e_4x4(host_index: int, **extra: str) -> dict[str, str]:
    """Host `host_index` of a v5e 4x4 (4 hosts x 4 chips) running SGLang-JAX."""
    env = contract_env("v5e", "4x4", hosts=4, chips_per_host=4, host_index=host_index,
                       model="hf://Qwen/Qwen3-0.6B", worker_hostnames=HOSTS)  # fmt: skip
    return (
        env
        | {
            "TPUSERVE_ENGINE": "sglang-jax",
            "TPUSERVE_WEIGHTS_CACHE_DIR": "/var/cache/tpuserve/weights",
            "TPUSERVE_COMPILE_CACHE_DIR": "/var/cache/tpuserve/xla",
            "TPUSERVE_ENGINE_VERSION": "ghcr.io/tpuserve/tpuserve-sglang-jax:1",
        }
        | extra
    )


def dry_run(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert launch.launch(env, dry_run=True) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def value(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def flags_of(command: list[str]) -> list[str]:
    return [arg for arg in command if arg.startswith("--")]


@pytest.mark.parametrize("host", [0, 2])
def test_multi_host_command_joins_the_slice_through_sgl_jax_distributed_init(
    host: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = dry_run(v5e_4x4(host), capsys)
    command, env = out["command"], out["env"]
    assert command[:3] == ["python3", "-m", "sgl_jax.launch_server"]
    assert value(command, "--device") == "tpu"
    assert value(command, "--tp-size") == "16"  # the slice's chips
    assert value(command, "--nnodes") == "4"
    assert value(command, "--node-rank") == str(host)
    assert value(command, "--dist-init-addr") == "jax-0.jax:20000"
    assert value(command, "--page-size") == "128"
    assert value(command, "--model-path") == "/var/cache/tpuserve/weights/hf/Qwen/Qwen3-0.6B/main"
    assert {"--enable-metrics", "--enable-cache-report"} <= set(command)
    # TorchTPU's switches and SGLang's KV-event flag are not SGLang-JAX's
    assert "--enable-torch-compile" not in command
    assert "--kv-events-config" not in command
    assert env["JAX_PLATFORMS"] == "tpu"
    assert env["TPU_WORKER_HOSTNAMES"] == ",".join(HOSTS)
    assert env["TPU_WORKER_ID"] == str(host)
    assert env["TPU_ACCELERATOR_TYPE"] == "v5litepod-16"
    assert env["JAX_COMPILATION_CACHE_DIR"] == (
        "/var/cache/tpuserve/xla/v5e-4x4/hf_Qwen_Qwen3-0.6B/"
        "ghcr.io_tpuserve_tpuserve-sglang-jax_1/jax"
    )
    assert not [name for name in env if name.startswith(("TORCH_TPU_", "MASTER_", "NODE_RANK"))]


def test_every_flag_the_launcher_sets_is_a_flag_of_sgl_jax(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = v5e_4x4(
        1,
        TPUSERVE_QUANTIZATION="fp8",
        TPUSERVE_KV_CACHE_DTYPE="fp8",
        TPUSERVE_CONTEXT_LENGTH="4096",
        TPUSERVE_HOST_KV_CACHE="write_back",
        TPUSERVE_HOST_KV_RATIO="2.5",
        TPUSERVE_LORA_ADAPTERS="sql=/adapters/sql",
        TPUSERVE_SPECULATIVE_ALGORITHM="MTP",
        TPUSERVE_SPECULATIVE_NUM_STEPS="3",
    )
    command = dry_run(env, capsys)["command"]
    assert set(flags_of(command)) - KNOWN == set()
    assert (value(command, "--quantization"), value(command, "--kv-cache-dtype")) == (
        "fp8",
        "fp8_e4m3",
    )
    assert value(command, "--hicache-storage") == "none"
    assert value(command, "--hicache-write-policy") == "write_back"
    assert value(command, "--hicache-ratio") == "2.5"
    assert value(command, "--lora-paths") == "sql=/adapters/sql"
    assert value(command, "--speculative-algorithm") == "NEXTN"
    for flag in (*sgl_jax_flags.FLAGS, *sgl_jax_flags.DEFAULT_FLAGS, *sgl_jax_flags.CPU_FLAGS):
        assert flag.name in KNOWN, f"{flag.name} is not a flag of SGLang-JAX's server"


def test_extra_args_go_last_and_a_page_size_given_replaces_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = v5e_4x4(0, TPUSERVE_SGLANG_EXTRA_ARGS="--page-size 256 --mem-fraction-static 0.8")
    command = dry_run(env, capsys)["command"]
    assert command.count("--page-size") == 1
    assert command[-4:] == ["--page-size", "256", "--mem-fraction-static", "0.8"]


def refusal(env: dict[str, str]) -> str:
    with pytest.raises(ContractError) as err:
        LaunchContract.from_env(env)
    return str(err.value)


def test_unknown_flags_are_refused_by_name_with_the_nearest_allowed() -> None:
    text = refusal(v5e_4x4(0, TPUSERVE_SGLANG_EXTRA_ARGS="--mem-frac 0.8 --enable-torch-compile"))
    assert "TPUSERVE_SGLANG_EXTRA_ARGS" in text
    assert "no flag --mem-frac (did you mean --mem-fraction-static" in text
    assert "--enable-torch-compile" in text
    assert f"{len(SERVER_FLAGS)} flags of SGLang-JAX's ServerArgs" in text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("--tp-size 4", "sets --tp-size, which the launcher sets"),
        ("--tensor-parallel-size=4", "sets --tensor-parallel-size, which the launcher sets"),
        ("--dist-init-addr x:1", "sets --dist-init-addr"),
        ("--api-key secret", "passes --api-key; secrets must not be on a command line"),
        ("--disaggregation-shared-secret s", "passes --disaggregation-shared-secret"),
    ],
)
def test_owned_and_secret_flags_are_refused(args: str, words: str) -> None:
    assert words in refusal(v5e_4x4(0, TPUSERVE_SGLANG_EXTRA_ARGS=args))


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("TPUSERVE_EXECUTION_MODE", "eager", "must be compiled"),
        ("TPUSERVE_QUANTIZATION", "mxfp4", "must be none or fp8"),
    ],
)
def test_what_sgl_jax_lacks_is_refused_naming_the_variable(
    variable: str, value: str, words: str
) -> None:
    text = refusal(v5e_4x4(0, **{variable: value}))
    assert f"{variable}='{value}'" in text
    assert words in text


def test_a_host_pool_in_gb_is_refused_for_its_ratio() -> None:
    env = v5e_4x4(0, TPUSERVE_HOST_KV_CACHE="write_through", TPUSERVE_HOST_KV_SIZE_GB="64")
    assert "TPUSERVE_HOST_KV_RATIO instead" in refusal(env)


def test_cpu_device_runs_native_attention_offline_with_one_device_per_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loopback = ("127.0.0.1", "127.0.0.2")
    env = contract_env("v5p", "2x2x2", hosts=2, chips_per_host=4, host_index=1,
                       model="/models/tiny-qwen3", worker_hostnames=loopback)  # fmt: skip
    env |= {"TPUSERVE_ENGINE": "sglang-jax", "TPUSERVE_DEVICE": "cpu"}
    out = dry_run(env, capsys)
    command = out["command"]
    assert command[0] == sys.executable  # the development venv's, unless the contract names one
    assert value(command, "--device") == "cpu"
    assert value(command, "--tp-size") == "2"  # one CPU device per host
    assert value(command, "--attention-backend") == "native"
    assert value(command, "--dist-init-addr") == "127.0.0.1:20000"
    # its Pallas TPU kernels (host tier load back, PD's KV write) run in TPU interpret mode
    shim = str(sgl_jax_cpu_shim.PYTHONPATH_ENTRY)
    assert out["env"] == {**sgl_jax_flags.CPU_ENV, "PYTHONPATH": shim}
    assert (Path(shim) / "sitecustomize.py").is_file()


def test_the_contract_names_the_sgl_jax_interpreter(capsys: pytest.CaptureFixture[str]) -> None:
    env = v5e_4x4(0, TPUSERVE_SGLANG_PYTHON="/opt/sglang-jax/bin/python")
    assert dry_run(env, capsys)["command"][0] == "/opt/sglang-jax/bin/python"
