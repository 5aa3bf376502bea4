"""A multi-host group simulated with one launcher process per host on loopback agrees.

Each host is a real `tpuserve engine launch --dry-run` process with its own environment,
as the operator would give each pod; hosts are distinct loopback addresses and the leader
is 127.0.0.1. Every value that must be shared (hostnames, leader, ports, TorchTPU topology,
slicebuilder addresses, profiling session, TP size) is identical, and ranks are distinct.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.component

PER_HOST_ENV = {"NODE_RANK", "TPU_WORKER_ID"}
PER_HOST_FLAGS = {"--node-rank"}


def launcher_env(
    generation: str, topology: str, hosts: int, chips: int, host: int
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    return env | {
        "TPUSERVE_MODEL": "/models/llama",
        "TPUSERVE_TPU_GENERATION": generation,
        "TPUSERVE_TPU_TOPOLOGY": topology,
        "TPUSERVE_HOSTS": str(hosts),
        "TPUSERVE_CHIPS_PER_HOST": str(chips),
        "TPUSERVE_HOST_INDEX": str(host),
        "TPUSERVE_WORKER_HOSTNAMES": ",".join(f"127.0.0.{i + 1}" for i in range(hosts)),
        "TPUSERVE_BIND_HOST": "127.0.0.1",
    }


def run_group(generation: str, topology: str, hosts: int, chips: int) -> list[dict[str, Any]]:
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tpuserve", "engine", "launch", "--dry-run"],
            env=launcher_env(generation, topology, hosts, chips, host),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host in range(hosts)
    ]
    outputs = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        outputs.append(json.loads(stdout))
    return outputs


def shared_part(output: dict[str, Any]) -> dict[str, Any]:
    command = list(output["command"])
    for flag in PER_HOST_FLAGS:
        command[command.index(flag) + 1] = "*"
    env = {k: v for k, v in output["env"].items() if k not in PER_HOST_ENV}
    return {"env": env, "command": command}


@pytest.mark.parametrize(
    ("generation", "topology", "hosts", "chips", "devices_per_host"),
    [("tpu7x", "2x2x2", 2, 4, 8), ("v6e", "4x4", 4, 4, 4), ("v5p", "2x2x4", 4, 4, 4)],
)
def test_hosts_agree_on_shared_values_and_take_distinct_ranks(
    generation: str, topology: str, hosts: int, chips: int, devices_per_host: int
) -> None:
    outputs = run_group(generation, topology, hosts, chips)
    first = shared_part(outputs[0])
    for output in outputs[1:]:
        assert shared_part(output) == first
    env = first["env"]
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["TPU_WORKER_HOSTNAMES"].split(",")[0] == "127.0.0.1"
    assert env["NNODES"] == str(hosts)
    assert len(env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == hosts * devices_per_host
    command = first["command"]
    assert command[command.index("--dist-init-addr") + 1] == "127.0.0.1:20000"
    assert command[command.index("--tp-size") + 1] == str(hosts * devices_per_host)
    ranks = [o["env"]["NODE_RANK"] for o in outputs]
    flags = [o["command"][o["command"].index("--node-rank") + 1] for o in outputs]
    worker_ids = [o["env"]["TPU_WORKER_ID"] for o in outputs]
    assert ranks == flags == worker_ids == [str(i) for i in range(hosts)]
