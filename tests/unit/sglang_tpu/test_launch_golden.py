"""`--dry-run` output for every generation x topology x host index matches a reviewed file.

Each file under golden/launch/ holds one slice shape: the contract used, the environment and
command every host shares, and per host only what differs (ranks). The files are reviewed
like code; when a change to the launcher changes them on purpose, regenerate and review the
diff:

    TPUSERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/sglang_tpu/test_launch_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import launch
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.pod_env import lws_hostnames
from sglang_tpu.topology import SLICE_SHAPES, SliceShape

pytestmark = pytest.mark.unit

GOLDEN_DIR = Path(__file__).parent / "golden" / "launch"
UPDATE = os.environ.get("TPUSERVE_UPDATE_GOLDEN") == "1"


def contract_env(shape: SliceShape) -> dict[str, str]:
    """The group's contract as an operator would render it for replica 1 of an LWS."""
    hostnames = lws_hostnames("llama", "llama", "serving", shape.hosts)
    return {
        "TPUSERVE_MODEL": "hf://meta-llama/Llama-3.1-8B-Instruct",
        "TPUSERVE_TPU_GENERATION": shape.generation.name,
        "TPUSERVE_TPU_TOPOLOGY": shape.topology,
        "TPUSERVE_HOSTS": str(shape.hosts),
        "TPUSERVE_CHIPS_PER_HOST": str(shape.chips_per_host),
        "TPUSERVE_REPLICA_INDEX": "1",
        "TPUSERVE_WORKER_HOSTNAMES": ",".join(hostnames),
        "TPUSERVE_KV_REPLAY_PORT": "5558",
        "TPUSERVE_WEIGHTS_CACHE_DIR": "/var/cache/tpuserve/weights",
        "TPUSERVE_COMPILE_CACHE_DIR": "/var/cache/tpuserve/compile",
    }


CHECKOUT = str(Path(__file__).resolve().parents[3])


def dry_run(env: dict[str, str]) -> dict[str, Any]:
    """The plan's `--dry-run` output, the checkout's own path (where the shims live on
    PYTHONPATH) written as <checkout> so the goldens hold in any clone."""
    plan = launch.plan(LaunchContract.from_env(env))
    result: dict[str, Any] = json.loads(plan.dry_run_json().replace(CHECKOUT, "<checkout>"))
    return result


def host_outputs(shape: SliceShape) -> list[dict[str, Any]]:
    base = contract_env(shape)
    return [dry_run({**base, "TPUSERVE_HOST_INDEX": str(i)}) for i in range(shape.hosts)]


def compact(shape: SliceShape, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """Shared env and host 0's command, then per host the env values and flags that differ."""
    first = outputs[0]
    shared = {k: v for k, v in first["env"].items() if all(o["env"].get(k) == v for o in outputs)}
    hosts = []
    for out in outputs:
        assert set(out["env"]) == set(first["env"])
        assert len(out["command"]) == len(first["command"])
        command_diff = {}
        for i, (mine, theirs) in enumerate(zip(out["command"], first["command"], strict=True)):
            if mine != theirs:
                assert first["command"][i - 1].startswith("--")  # only flag values differ
                command_diff[first["command"][i - 1]] = mine
        env_diff = {k: v for k, v in out["env"].items() if k not in shared}
        hosts.append({"env": env_diff, "command": command_diff})
    contract = contract_env(shape)
    return {"contract": contract, "env": shared, "command": first["command"], "hosts": hosts}


def expand(golden: dict[str, Any], host: int) -> dict[str, Any]:
    """One host's full `--dry-run` output from a golden file."""
    command = list(golden["command"])
    for name, value in golden["hosts"][host]["command"].items():
        command[command.index(name) + 1] = value
    return {"env": {**golden["env"], **golden["hosts"][host]["env"]}, "command": command}


def golden_path(shape: SliceShape) -> Path:
    return GOLDEN_DIR / f"{shape.generation.name}-{shape.topology}.json"


def render(golden: dict[str, Any]) -> str:
    return json.dumps(golden, indent=1, sort_keys=True) + "\n"


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_dry_run_matches_the_reviewed_expectation(shape: SliceShape) -> None:
    outputs = host_outputs(shape)
    path = golden_path(shape)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(compact(shape, outputs)))
    golden = json.loads(path.read_text())
    assert golden["contract"] == contract_env(shape), f"contract changed; regenerate {path.name}"
    assert len(golden["hosts"]) == shape.hosts
    for host, out in enumerate(outputs):
        assert out == expand(golden, host), f"{path.name} host {host} is stale"


def test_golden_files_are_exactly_the_catalog() -> None:
    expected = {golden_path(s).name for s in SLICE_SHAPES}
    assert {p.name for p in GOLDEN_DIR.glob("*.json")} == expected


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_goldens_say_what_the_catalog_says(shape: SliceShape) -> None:
    """Independent of the launcher: ranks, hostnames, topology, TP size, leader per shape."""
    golden = json.loads(golden_path(shape).read_text())
    names = [n.replace("{replica}", "1") for n in lws_hostnames("llama", "llama", "serving", 8)]
    leader = "llama-1.llama.serving.svc"
    for host in range(shape.hosts):
        out = expand(golden, host)
        env, command = out["env"], out["command"]
        assert command[command.index("--tp-size") + 1] == str(shape.devices)
        assert env["TORCH_TPU_TOPOLOGY"] == shape.host_topology
        assert env["TORCH_TPU_DEVICES_PER_HOST"] == str(shape.devices_per_host)
        assert env["TPU_WORKER_ID"] == str(host)
        assert env["TPU_ACCELERATOR_TYPE"] == shape.accelerator_type
        assert "--enable-cache-report" in command
        assert json.loads(command[command.index("--kv-events-config") + 1])["bind"] is True
        hostnames = env["TPU_WORKER_HOSTNAMES"].split(",")
        assert len(hostnames) == shape.hosts
        assert hostnames[0] == leader
        assert hostnames[: min(8, shape.hosts)] == names[: min(8, shape.hosts)]
        if shape.multi_host:
            assert (env["NNODES"], env["NODE_RANK"]) == (str(shape.hosts), str(host))
            assert env["MASTER_ADDR"] == leader
            assert command[command.index("--node-rank") + 1] == str(host)
            assert command[command.index("--dist-init-addr") + 1] == f"{leader}:20000"
            addresses = env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")
            assert len(addresses) == shape.devices
        else:
            assert "NODE_RANK" not in env
            assert "--nnodes" not in command
