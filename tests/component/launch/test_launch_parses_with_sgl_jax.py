"""The launcher's SGLang-JAX command lines parse with SGLang-JAX's own ServerArgs.

Each command `tpuserve engine launch` plans for `TPUSERVE_ENGINE=sglang-jax` (one host, each
rank of a multi-host v5e 4x4, the cpu device, every contract setting that adds a flag) goes
through `ServerArgs.add_cli_args`, `ServerArgs.from_cli_args` (its `__post_init__`, which
asserts `--device` against `JAX_PLATFORMS`) and `check_server_args` (tensor parallelism
divisible by the node count, ...) of the real sgl_jax in the opt-in SGLang-JAX build, with
the environment the launcher plans (one process per JAX platform): no unknown flag, nothing
refused, and the values SGLang-JAX reads back are the ones the launcher meant. Nothing of
SGLang-JAX is copied here.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from sglang_tpu import launch
from sglang_tpu.contract.launch_contract import LaunchContract
from tests.contract_env import contract_env
from tests.real_sglang_jax import sgl_jax_python

pytestmark = pytest.mark.component

READ_BACK = ("model_path", "served_model_name", "device", "tp_size", "nnodes", "node_rank",
             "dist_init_addr", "host", "port", "enable_metrics", "enable_cache_report",
             "page_size", "quantization", "kv_cache_dtype", "context_length", "hicache_storage",
             "hicache_write_policy", "hicache_ratio", "mem_fraction_static", "attention_backend",
             "enable_lora", "precompile_bs_paddings")  # fmt: skip
PARSE = """
import argparse, json, os, sys
cases = json.load(sys.stdin)
out = {}
for name, case in cases.items():
    os.environ.clear()
    os.environ.update(case["env"])
    from sgl_jax.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args, unknown = parser.parse_known_args(case["argv"])
    try:
        server_args = ServerArgs.from_cli_args(args)
        server_args.check_server_args()
        error = None
    except Exception as err:
        server_args, error = None, f"{type(err).__name__}: {err}"
    values = {} if server_args is None else {
        k: getattr(server_args, k) for k in sys.argv[1].split(",")
    }
    out[name] = {"unknown": unknown, "error": error, "values": values}
print(json.dumps(out, default=str))
"""
HOSTS = ("jax-0.jax.ml.svc", "jax-1.jax.ml.svc", "jax-2.jax.ml.svc", "jax-3.jax.ml.svc")


def v5e_4x4(rank: int, **extra: str) -> dict[str, str]:
    env = contract_env("v5e", "4x4", hosts=4, chips_per_host=4, host_index=rank,
                       model="hf://Qwen/Qwen3-8B", worker_hostnames=HOSTS)  # fmt: skip
    return env | {"TPUSERVE_ENGINE": "sglang-jax", "TPUSERVE_WEIGHTS_CACHE_DIR": "/w"} | extra


CONTRACTS: dict[str, dict[str, str]] = {
    "single-host": contract_env("v5e", "2x2", 1, 4, 0, model="/models/qwen")
    | {"TPUSERVE_ENGINE": "sglang-jax"},
    "leader": v5e_4x4(0),
    "rank-2": v5e_4x4(2),
    "every-setting": v5e_4x4(
        3,
        TPUSERVE_QUANTIZATION="fp8",
        TPUSERVE_KV_CACHE_DTYPE="fp8",
        TPUSERVE_CONTEXT_LENGTH="4096",
        TPUSERVE_HOST_KV_CACHE="write_back",
        TPUSERVE_HOST_KV_RATIO="2.5",
        TPUSERVE_LORA_ADAPTERS="sql=/adapters/sql",
        TPUSERVE_SGLANG_EXTRA_ARGS="--mem-fraction-static 0.8 --page-size 256 "
        "--precompile-bs-paddings 8 32",
    ),
    "cpu-rank-1": contract_env(
        "v5p", "2x2x2", 2, 4, 1, model="/models/tiny", worker_hostnames=("127.0.0.1", "127.0.0.2")
    )
    | {"TPUSERVE_ENGINE": "sglang-jax", "TPUSERVE_DEVICE": "cpu"},
}


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    python = sgl_jax_python()  # or a skip naming scripts/build-sglang-jax.sh
    cases: dict[str, dict[str, Any]] = {}
    for name, env in CONTRACTS.items():
        plan = launch.plan(LaunchContract.from_env(env))
        start = plan.command.index("sgl_jax.launch_server") + 1
        cases[name] = {"argv": plan.command[start:], "env": {**plan.env, "HOME": "/tmp"}}
    result: dict[str, Any] = {}
    for platform in sorted({case["env"]["JAX_PLATFORMS"] for case in cases.values()}):
        # one process per JAX platform: JAX reads JAX_PLATFORMS once, at its import
        group = {k: v for k, v in cases.items() if v["env"]["JAX_PLATFORMS"] == platform}
        done = subprocess.run(
            [python, "-c", PARSE, ",".join(READ_BACK)],
            input=json.dumps(group),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
            cwd="/tmp",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result |= json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("name", list(CONTRACTS))
def test_sgl_jax_accepts_the_command_line(parsed: dict[str, Any], name: str) -> None:
    assert parsed[name]["unknown"] == [], f"SGLang-JAX does not know {parsed[name]['unknown']}"
    assert parsed[name]["error"] is None


def test_multi_host_ranks_join_the_leader_with_tp_over_the_slice(parsed: dict[str, Any]) -> None:
    leader, rank2 = parsed["leader"]["values"], parsed["rank-2"]["values"]
    for values, rank in ((leader, 0), (rank2, 2)):
        assert (values["tp_size"], values["nnodes"], values["node_rank"]) == (16, 4, rank)
        assert values["dist_init_addr"] == f"{HOSTS[0]}:20000"
        assert values["device"] == "tpu"
        assert values["page_size"] == 128
        assert (values["host"], values["port"]) == ("0.0.0.0", 30000)
        assert values["enable_metrics"] is True
        assert values["enable_cache_report"] is True
    assert leader["model_path"] == "/w/hf/Qwen/Qwen3-8B/main"


def test_contract_settings_arrive_as_sgl_jax_reads_them(parsed: dict[str, Any]) -> None:
    values = parsed["every-setting"]["values"]
    assert (values["quantization"], values["kv_cache_dtype"]) == ("fp8", "fp8_e4m3")
    assert values["context_length"] == 4096
    assert (values["hicache_storage"], values["hicache_write_policy"]) == ("none", "write_back")
    assert values["hicache_ratio"] == 2.5
    assert values["enable_lora"] is True
    assert values["mem_fraction_static"] == 0.8
    assert values["page_size"] == 256  # spec.engine.args' page size replaces the default
    assert values["precompile_bs_paddings"] == [8, 32]


def test_the_cpu_device_gets_native_attention_and_one_device_per_host(
    parsed: dict[str, Any],
) -> None:
    values = parsed["cpu-rank-1"]["values"]
    assert (values["device"], values["attention_backend"]) == ("cpu", "native")
    assert (values["tp_size"], values["nnodes"], values["node_rank"]) == (2, 2, 1)
