"""`tpuserve engine launch`: exit 2 naming each bad variable, and the key slices' derivations."""

from __future__ import annotations

import argparse
import json
from typing import TypedDict

import pytest

from sglang_tpu import launch, perf_model
from sglang_tpu.contract.env_names import Var
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.sim import cli as sim_cli
from tests.contract_env import contract_env
from tpuserve import cli

pytestmark = pytest.mark.unit


def env_for(generation: str, topology: str, hosts: int, chips: int, host: int) -> dict[str, str]:
    names = [f"srv-{i}.srv.ns.svc" for i in range(hosts)]
    return contract_env(generation, topology, hosts, chips, host, worker_hostnames=names)


IRONWOOD = {
    **env_for("tpu7x", "2x2x2", 2, 4, 1),
    "TPUSERVE_MODEL": "hf://Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8",
    "TPUSERVE_WEIGHTS_CACHE_DIR": "/var/cache/weights",
}

# One malformed value per variable; a new variable without one fails the next test.
MALFORMED: dict[Var, str] = {
    Var.MODEL: "s3://bucket/model",
    Var.SERVED_MODEL_NAME: "   ",
    Var.ENGINE: "vllm",
    Var.DEVICE: "gpu",
    Var.TPU_GENERATION: "v4",
    Var.TPU_TOPOLOGY: "3x3",
    Var.HOSTS: "two",
    Var.CHIPS_PER_HOST: "8",
    Var.REPLICA_INDEX: "-1",
    Var.WORKER_HOSTNAMES: "a,b,c",
    Var.GROUP_KEY: "x" * 254,
    Var.BIND_HOST: "localhost",
    Var.HTTP_PORT: "70000",
    Var.METRICS_PORT: "9090",
    Var.KV_EVENTS_PORT: "0",
    Var.KV_REPLAY_PORT: "port",
    Var.DIST_INIT_PORT: "65530",
    Var.MASTER_PORT: "30000",
    Var.TPU_PROCESS_PORT: "20003",
    Var.SLICEBUILDER_BASE_PORT: "29495",
    Var.TORCH_TPU_HANDSHAKE_PORT: "8071",  # inside the slicebuilder range 8070-8077
    Var.EXECUTION_MODE: "lazy",
    Var.QUANTIZATION: "int4",
    Var.KV_CACHE_DTYPE: "fp16",
    Var.CONTEXT_LENGTH: "0",
    Var.SPECULATIVE_ALGORITHM: "EAGLE2",
    Var.SPECULATIVE_DRAFT_MODEL: "/models/draft",
    Var.SPECULATIVE_NUM_STEPS: "2",
    Var.HOST_KV_CACHE: "write_sometimes",
    Var.HOST_KV_SIZE_GB: "12",  # only with TPUSERVE_HOST_KV_CACHE
    Var.HOST_KV_RATIO: "0",
    Var.LORA_ADAPTERS: "sql:v2=hf://o/sql-lora",
    Var.SGLANG_EXTRA_ARGS: "--tp-size 4",
    Var.SGLANG_PYTHON: "venv/bin/python",
    Var.CPU_KERNEL_SHIM_DIR: "/opt/shim",  # only with TPUSERVE_DEVICE=cpu
    Var.SIM_MODEL_PROFILE: "no-such-model",
    Var.MODEL_ARCHITECTURE: '{"num_hidden_layers": "32"}',
    Var.COMPILE_CACHE_DIR: "relative/dir",
    Var.ENGINE_VERSION: "two words",
    Var.GCS_FUSE_ROOT: "gcs",
    Var.WEIGHTS_CACHE_DIR: "cache",
    Var.HF_TOKEN_ENV: "HF-TOKEN",
    Var.DRAIN_TIMEOUT_SECONDS: "-5",
    Var.TERMINATION_MESSAGE_PATH: "dev/termination-log",
    Var.HOST_INDEX: "2",
    Var.POD_NAME: "Pod_Name",
    Var.POD_IP: "10.0.0",
}


class Plan(TypedDict):
    """What `launch --dry-run` prints: the server's environment and command line."""

    env: dict[str, str]
    command: list[str]


def dry_run(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Plan:
    assert launch.launch(env, dry_run=True) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object
    plan: Plan = json.loads(out)
    assert set(plan) == {"env", "command"}
    assert all(isinstance(v, str) for v in plan["env"].values())
    assert all(isinstance(a, str) for a in plan["command"])
    return plan


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_every_variable_has_a_malformed_example() -> None:
    assert set(MALFORMED) == set(Var)


@pytest.mark.parametrize("variable", list(Var), ids=str)
def test_a_malformed_variable_exits_2_naming_it(
    variable: Var, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**IRONWOOD, variable.value: MALFORMED[variable]}
    assert launch.launch(env, dry_run=True) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{variable.value}=" in captured.err


@pytest.mark.parametrize("variable", [v for v in Var if v.value in IRONWOOD], ids=str)
def test_a_missing_variable_exits_2_naming_it(
    variable: Var, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in IRONWOOD.items() if k != variable.value}
    assert launch.launch(env, dry_run=True) == 2
    assert f"{variable.value}=unset" in capsys.readouterr().err


def test_the_tpuserve_command_runs_the_launcher(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in env_for("v6e", "2x4", 1, 8, 0).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["engine", "launch", "--dry-run"]) == 0
    assert flag(json.loads(capsys.readouterr().out)["command"], "--tp-size") == "8"
    monkeypatch.setenv("TPUSERVE_HOSTS", "2")
    assert cli.main(["engine", "launch", "--dry-run"]) == 2


@pytest.mark.parametrize("generation", ["v5e", "v6e"])
def test_single_host_eight_chips(generation: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = dry_run(env_for(generation, "2x4", 1, 8, 0), capsys)
    env, command = out["env"], out["command"]
    assert isinstance(env, dict)
    assert isinstance(command, list)
    assert command[:3] == ["python3", "-m", "sglang_tpu.sglang_tpu_server"]  # the adapter
    assert flag(command, "--tp-size") == "8"
    assert flag(command, "--device") == "tpu"
    assert "--nnodes" not in command
    assert "--dist-init-addr" not in command
    assert (flag(command, "--host"), flag(command, "--port")) == ("0.0.0.0", "30000")
    assert env["TORCH_TPU_TOPOLOGY"] == "2,4,1"
    assert env["TORCH_TPU_DEVICES_PER_HOST"] == "8"
    assert env["TPU_WORKER_HOSTNAMES"] == "srv-0.srv.ns.svc"
    assert env["TPU_WORKER_ID"] == "0"
    assert env["TPU_ACCELERATOR_TYPE"] == f"{'v5litepod' if generation == 'v5e' else 'v6e'}-8"
    assert env["TORCH_TPU_INTERNAL_HANDSHAKE_PORT"] == "36423"
    assert env["TORCH_TPU_TIER2_COMPILATION_CACHE"]
    assert not {"NNODES", "NODE_RANK", "MASTER_ADDR", "TORCH_TPU_SLICEBUILDER_ADDRESSES"} & set(env)
    assert "--enable-cache-report" in command
    kv = json.loads(flag(command, "--kv-events-config"))
    assert kv == {"publisher": "zmq", "endpoint": "tcp://*:5557", "bind": True}


@pytest.mark.parametrize("host", [0, 1])
def test_ironwood_2x2x2_is_two_vms_of_four_chips_and_eight_devices(
    host: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = dry_run({**IRONWOOD, "TPUSERVE_HOST_INDEX": str(host)}, capsys)
    env, command = out["env"], out["command"]
    assert isinstance(env, dict)
    assert flag(command, "--tp-size") == "16"
    assert (flag(command, "--nnodes"), flag(command, "--node-rank")) == ("2", str(host))
    assert flag(command, "--dist-init-addr") == "srv-0.srv.ns.svc:20000"
    assert flag(command, "--model-path") == (
        "/var/cache/weights/hf/Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8/main"
    )
    assert flag(command, "--served-model-name") == "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
    assert env["TORCH_TPU_TOPOLOGY"] == "2,2,1,2"
    assert env["TORCH_TPU_DEVICES_PER_HOST"] == "8"
    assert (env["NNODES"], env["NODE_RANK"], env["TPU_WORKER_ID"]) == ("2", str(host), str(host))
    assert env["MASTER_ADDR"] == "srv-0.srv.ns.svc"
    assert env["TPU_WORKER_HOSTNAMES"] == "srv-0.srv.ns.svc,srv-1.srv.ns.svc"
    addresses = env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
    assert len(addresses) == 16
    assert addresses[0] == "srv-0.srv.ns.svc:8070"
    assert addresses[15] == "srv-1.srv.ns.svc:8077"
    assert env["HF_HOME"] == "/var/cache/weights/hf-home"


def test_v6e_4x4_is_four_hosts_of_four_chips(capsys: pytest.CaptureFixture[str]) -> None:
    outs = [dry_run(env_for("v6e", "4x4", 4, 4, host), capsys) for host in range(4)]
    for host, out in enumerate(outs):
        env, command = out["env"], out["command"]
        assert isinstance(env, dict)
        assert flag(command, "--tp-size") == "16"
        assert flag(command, "--node-rank") == env["NODE_RANK"] == str(host)
        assert env["TORCH_TPU_TOPOLOGY"] == "2,2,1"
        assert env["TORCH_TPU_DEVICES_PER_HOST"] == "4"
        assert env["MASTER_ADDR"] == "srv-0.srv.ns.svc"
        assert len(env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == 16
    shared = {k for k in outs[0]["env"] if k not in ("NODE_RANK", "TPU_WORKER_ID")}
    for out in outs[1:]:
        assert {k: out["env"][k] for k in shared} == {k: outs[0]["env"][k] for k in shared}


def test_engine_options_reach_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        **env_for("v6e", "2x4", 1, 8, 0),
        "TPUSERVE_QUANTIZATION": "nvfp4",
        "TPUSERVE_KV_CACHE_DTYPE": "fp8",
        "TPUSERVE_CONTEXT_LENGTH": "32768",
        "TPUSERVE_SPECULATIVE_ALGORITHM": "EAGLE3",
        "TPUSERVE_SPECULATIVE_DRAFT_MODEL": "pvc://drafts/eagle3-llama",
        "TPUSERVE_SPECULATIVE_NUM_STEPS": "3",
        "TPUSERVE_SGLANG_EXTRA_ARGS": "--mem-fraction-static 0.85 --chat-template 'a b.jinja'",
        "TPUSERVE_KV_REPLAY_PORT": "5558",
        "TPUSERVE_BIND_HOST": "127.0.0.1",
        "TPUSERVE_EXECUTION_MODE": "eager-defer-and-fuse",
        "TPUSERVE_SERVED_MODEL_NAME": "llama",
    }
    out = dry_run(env, capsys)
    command = out["command"]
    assert isinstance(command, list)
    assert flag(command, "--quantization") == "modelopt_fp4"
    assert flag(command, "--kv-cache-dtype") == "fp8_e4m3"
    assert flag(command, "--context-length") == "32768"
    assert flag(command, "--speculative-algorithm") == "EAGLE3"
    assert (
        flag(command, "--speculative-draft-model-path") == "/mnt/tpuserve/pvc/drafts/eagle3-llama"
    )
    assert flag(command, "--speculative-num-steps") == "3"
    assert command[-4:] == ["--mem-fraction-static", "0.85", "--chat-template", "a b.jinja"]
    assert "--enable-torch-compile" not in command
    assert json.loads(flag(command, "--kv-events-config")) == {
        "publisher": "zmq",
        "bind": True,
        "endpoint": "tcp://127.0.0.1:5557",
        "replay_endpoint": "tcp://127.0.0.1:5558",
    }
    assert out["env"]["TORCH_TPU_DEFER_AND_FUSE"] == "1"


def test_host_kv_tier_reaches_sglang_and_the_twin(capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        **env_for("v5e", "2x4", 1, 8, 0),
        "TPUSERVE_HOST_KV_CACHE": "write_back",
        "TPUSERVE_HOST_KV_SIZE_GB": "30",
    }
    command = dry_run(env, capsys)["command"]
    assert "--enable-hierarchical-cache" in command
    assert flag(command, "--hicache-write-policy") == "write_back"
    assert flag(command, "--hicache-size") == "30"
    assert flag(command, "--hicache-io-backend") == "direct"
    assert "--hicache-ratio" not in command
    twin = dry_run({**env, "TPUSERVE_ENGINE": "simulated"}, capsys)["command"]
    args = sim_args(twin)
    assert args.enable_hierarchical_cache
    assert (args.hicache_size, args.hicache_write_policy) == (30, "write_back")
    by_ratio = {k: v for k, v in env.items() if k != "TPUSERVE_HOST_KV_SIZE_GB"}
    ratio = dry_run({**by_ratio, "TPUSERVE_HOST_KV_RATIO": "2.5"}, capsys)
    assert flag(ratio["command"], "--hicache-ratio") == "2.5"
    assert "--hicache-size" not in ratio["command"]
    off = dry_run(env_for("v5e", "2x4", 1, 8, 0), capsys)["command"]
    assert not [a for a in off if "hicache" in a or "hierarchical" in a]


def test_host_kv_size_and_ratio_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        **env_for("v5e", "2x4", 1, 8, 0),
        "TPUSERVE_HOST_KV_CACHE": "write_through",
        "TPUSERVE_HOST_KV_SIZE_GB": "30",
        "TPUSERVE_HOST_KV_RATIO": "2",
    }
    assert launch.launch(env, dry_run=True) == 2
    assert "TPUSERVE_HOST_KV_RATIO=" in capsys.readouterr().err


def test_the_host_kv_flags_are_the_operators(capsys: pytest.CaptureFixture[str]) -> None:
    env = {**env_for("v5e", "2x4", 1, 8, 0), "TPUSERVE_SGLANG_EXTRA_ARGS": "--hicache-size 9"}
    assert launch.launch(env, dry_run=True) == 2
    assert "--hicache-size" in capsys.readouterr().err


def test_mtp_uses_sglangs_nextn_without_a_draft_model(capsys: pytest.CaptureFixture[str]) -> None:
    env = {**env_for("v6e", "2x4", 1, 8, 0), "TPUSERVE_SPECULATIVE_ALGORITHM": "MTP"}
    command = dry_run(env, capsys)["command"]
    assert flag(command, "--speculative-algorithm") == "NEXTN"
    assert "--speculative-draft-model-path" not in command


def test_compile_cache_is_keyed_by_slice_model_and_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {
        **IRONWOOD,
        "TPUSERVE_COMPILE_CACHE_DIR": "/cache/compile/",
        "TPUSERVE_ENGINE_VERSION": "ghcr.io/tpuserve/tpuserve-tpu:0.3.0",
    }
    out = dry_run(env, capsys)["env"]
    assert isinstance(out, dict)
    root = (
        "/cache/compile/tpu7x-2x2x2/hf_Qwen_Qwen3-Coder-480B-A35B-Instruct-FP8/"
        "ghcr.io_tpuserve_tpuserve-tpu_0.3.0"
    )
    assert out["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == f"{root}/torch_tpu"
    assert out["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/inductor"


def sim_args(command: list[str]) -> argparse.Namespace:
    """Parse a launcher-built `tpuserve engine sim` command with the engine twin's own parser."""
    assert command[:3] == ["tpuserve", "engine", "sim"]
    parser = argparse.ArgumentParser()
    sim_cli.configure(parser)
    return parser.parse_args(command[3:])


def test_simulated_leader_runs_the_engine_twin_with_the_same_slice_and_ports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {
        **IRONWOOD,
        "TPUSERVE_ENGINE": "simulated",
        "TPUSERVE_HOST_INDEX": "0",
        "TPUSERVE_HTTP_PORT": "8000",
        "TPUSERVE_KV_REPLAY_PORT": "5558",
        "TPUSERVE_QUANTIZATION": "mxfp4",
        "TPUSERVE_CONTEXT_LENGTH": "8192",
        "TPUSERVE_SIM_MODEL_PROFILE": "llama-3.1-8b",
    }
    out = dry_run(env, capsys)
    command = out["command"]
    assert isinstance(command, list)
    args = sim_args(command)
    assert (args.tpu, args.topology, args.host, args.port) == ("tpu7x", "2x2x2", "0.0.0.0", 8000)
    assert args.served_model_name == "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
    assert (args.model_profile, args.quantization, args.context_length) == (
        "llama-3.1-8b",
        "int4",
        8192,
    )
    assert args.kv_events_endpoint == "tcp://*:5557"
    assert args.kv_events_replay_endpoint == "tcp://*:5558"
    assert args.drain_grace_seconds == 20
    assert out["env"]["NNODES"] == "2"


@pytest.mark.parametrize("mode", ["compiled", "eager", "eager-defer-and-fuse"])
def test_the_twin_runs_its_steps_in_the_contracts_execution_mode(mode: str) -> None:
    """An eager engine's twin adds the performance model's per-layer host time to each step
    (issue 58: TorchTPU's eager steps measured on real model code)."""
    env = {**env_for("v6e", "2x4", 1, 8, 0), "TPUSERVE_ENGINE": "simulated"}
    env["TPUSERVE_EXECUTION_MODE"] = mode
    command = launch.plan(LaunchContract.from_env(env)).command
    assert ("--execution-mode" in command) is (mode != "compiled")
    settings = sim_cli.build_settings(sim_args(command))
    assert settings.timer.execution_mode == mode
    compiled = perf_model.StepTimer(settings.timer.shape, settings.timer.profile)
    extra = settings.timer.decode_step_seconds(8, 8192) - compiled.decode_step_seconds(8, 8192)
    layers = settings.timer.profile.layers
    per_layer = perf_model.CALIBRATED.eager_layer_seconds
    assert extra == pytest.approx(0.0 if mode == "compiled" else layers * per_layer)


def test_simulated_follower_only_holds_its_place(capsys: pytest.CaptureFixture[str]) -> None:
    env = {**IRONWOOD, "TPUSERVE_ENGINE": "simulated"}
    assert dry_run(env, capsys)["command"] == ["sleep", "infinity"]


def test_simulated_engine_needs_no_weights(capsys: pytest.CaptureFixture[str]) -> None:
    env = {**env_for("v6e", "2x4", 1, 8, 0), "TPUSERVE_ENGINE": "simulated"}
    contract = LaunchContract.from_env(env)
    assert launch.plan(contract).fetches == []
    assert sim_args(launch.plan(contract).command).model_profile == "llama-3.1-8b"


def test_hf_token_never_appears_in_the_plan_but_reaches_the_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {**IRONWOOD, "TPUSERVE_HF_TOKEN_ENV": "MY_HF_TOKEN", "MY_HF_TOKEN": "hf_s3cret"}
    assert launch.launch(env, dry_run=True) == 0
    assert "hf_s3cret" not in capsys.readouterr().out
    contract = LaunchContract.from_env(env)
    server = launch.server_env(contract, launch.plan(contract), env)
    assert server["HF_TOKEN"] == "hf_s3cret"


def test_single_host_server_does_not_inherit_job_completion_index() -> None:
    env = {**env_for("v6e", "2x4", 1, 8, 0), "JOB_COMPLETION_INDEX": "0", "PATH": "/bin"}
    contract = LaunchContract.from_env(env)
    server = launch.server_env(contract, launch.plan(contract), env)
    assert "JOB_COMPLETION_INDEX" not in server
    assert server["PATH"] == "/bin"


def test_derived_variables_override_what_webhooks_injected() -> None:
    env = {**IRONWOOD, "TPU_WORKER_HOSTNAMES": "lws-0.lws", "TPU_PROCESS_PORT": "8471"}
    contract = LaunchContract.from_env(env)
    server = launch.server_env(contract, launch.plan(contract), env)
    assert server["TPU_WORKER_HOSTNAMES"] == "srv-0.srv.ns.svc,srv-1.srv.ns.svc"
    assert server["TPU_PROCESS_PORT"] == "8476"


def test_no_derived_variable_is_empty(capsys: pytest.CaptureFixture[str]) -> None:
    out = dry_run(IRONWOOD, capsys)
    assert all(value != "" for value in out["env"].values())


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (3, 3), (-15, 143), (-9, 137)])
def test_exit_status_follows_the_shell_convention(returncode: int, status: int) -> None:
    assert launch.exit_status(returncode) == status
