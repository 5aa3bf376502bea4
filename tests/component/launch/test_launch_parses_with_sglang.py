"""Every golden launcher command line parses with the pinned SGLang's own argument parser.

The leader command of each golden file (`tests/unit/sglang_tpu/golden/launch/`; the other
hosts differ only in `--node-rank`) goes through `ServerArgs.add_cli_args` of SGLang 0.5.23 in
the real-SGLang venv (nothing of SGLang is copied here): no unknown flag, no value refused, and
the values SGLang reads back are the ones the launcher meant. The `--kv-events-config` JSON is
read by SGLang's own `KVEventsConfig.from_cli` (from the wheel, `tests.sglang_kv_events`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import launch
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.sglang_flags import TPU_SGLANG_MODULE
from tests.contract_env import contract_env
from tests.real_sglang import RealSGLang
from tests.sglang_kv_events import sglang_kv_events

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "unit" / "sglang_tpu" / "golden" / "launch"
# SGLang's own launcher (cpu) and the TorchTPU entry (tpu), which takes SGLang's flags unchanged
LAUNCH_MODULES = (("-m", "sglang.launch_server"), TPU_SGLANG_MODULE)


def sglang_argv(command: list[str]) -> list[str]:
    """What follows `python -m MODULE` of either launch module: SGLang's own arguments."""
    for module in LAUNCH_MODULES:
        if module[1] in command:
            start = command.index(module[1]) + 1
            assert command[start - 2 : start] == list(module), command
            return command[start:]
    raise AssertionError(f"no SGLang launch module in {command}")


READ_BACK = ("model_path", "served_model_name", "device", "tp_size", "nnodes", "node_rank",
             "dist_init_addr", "host", "port", "enable_metrics", "enable_cache_report",
             "kv_events_config", "enable_torch_compile")  # fmt: skip
PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
read_back = sys.argv[1].split(",")
out = {}
for name, argv in json.load(sys.stdin).items():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args, unknown = parser.parse_known_args(argv)
    out[name] = {"unknown": unknown, "args": {k: getattr(args, k) for k in read_back}}
print(json.dumps(out))
"""


def golden_commands() -> dict[str, list[str]]:
    """File name -> the launcher's arguments to `python -m sglang.launch_server`."""
    out = {}
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        out[path.stem] = sglang_argv(json.loads(path.read_text())["command"])
    return out


def flag_values(argv: list[str]) -> dict[str, Any]:
    """`--flag value` and bare `--flag` (True) as SGLang's dest names."""
    out: dict[str, Any] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
            out[token.removeprefix("--").replace("-", "_")] = value
    return out


def parse_with_sglang(
    real_sglang: RealSGLang, commands: dict[str, list[str]], read_back: tuple[str, ...]
) -> dict[str, Any]:
    """Each command's unknown arguments and the `read_back` values SGLang's parser gives."""
    done = subprocess.run(
        [str(real_sglang.python), "-c", PARSE, ",".join(read_back)],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        env=real_sglang.environment(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def lora_command() -> list[str]:
    env = contract_env() | {
        "TPUSERVE_WEIGHTS_CACHE_DIR": "/w",
        "TPUSERVE_LORA_ADAPTERS": "sql=hf://org/sql-lora,law=/adapters/law",
    }
    command = launch.plan(LaunchContract.from_env(env)).command
    return sglang_argv(command)


@pytest.fixture(scope="module")
def parsed(real_sglang: RealSGLang) -> dict[str, Any]:
    """Every golden command and the LoRA one, parsed in one process (importing SGLang's server
    arguments takes seconds)."""
    commands = golden_commands() | {"lora": lora_command()}
    return parse_with_sglang(real_sglang, commands, (*READ_BACK, "enable_lora", "lora_paths"))


def test_every_golden_command_line_parses_with_sglangs_parser(parsed: dict[str, Any]) -> None:
    commands = golden_commands()
    assert len(commands) >= 20
    kv_events_config = sglang_kv_events().KVEventsConfig
    for name, argv in commands.items():
        unknown, args = parsed[name]["unknown"], parsed[name]["args"]
        assert not unknown, f"{name}: SGLang does not know {unknown}"
        for key, value in flag_values(argv).items():
            assert key in args, f"{name}: --{key} is not read back"
            assert str(args[key]) == str(value), f"{name}: --{key} {value!r} read as {args[key]!r}"
        config = kv_events_config.from_cli(args["kv_events_config"])
        assert config.publisher == "zmq", name
        assert config.bind is True, f"{name}: the KV-event endpoint must bind"


def test_lora_adapters_parse_as_sglangs_lora_paths(parsed: dict[str, Any]) -> None:
    lora = parsed["lora"]
    assert lora["unknown"] == []
    assert {k: lora["args"][k] for k in ("enable_lora", "lora_paths")} == {
        "enable_lora": True,
        "lora_paths": ["sql=/w/hf/org/sql-lora/main", "law=/adapters/law"],
    }
