"""`TPUSERVE_ENGINE=simulated`: the launcher runs the engine twin from the same contract.

A real `tpuserve engine launch` process on loopback starts `tpuserve engine sim` for the
leader of a two-host tpu7x 2x2x2 slice; the official openai client reaches it under the
served model name, and SIGTERM to the launcher drains the twin, which exits 0. LoRA adapters
of the contract (`TPUSERVE_LORA_ADAPTERS`) are served and listed by the twin and, through a
`tpuserve router` in front, as `MODEL:ADAPTER`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import openai
import pytest

from tests.contract_env import contract_ports
from tests.waiting import eventually
from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component

DEADLINE_SECONDS = 120


def wait_healthy(url: str, launcher: subprocess.Popen[bytes]) -> None:
    def healthy() -> bool:
        assert launcher.poll() is None, "the launcher exited before the engine was healthy"
        with urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)

    eventually(
        healthy,
        what=f"{url}/health to answer 200",
        timeout_seconds=DEADLINE_SECONDS,
        ignore=(URLError, ConnectionError, TimeoutError),
    )


def contract(host: int, http_port: int, kv_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env | {
        "TPUSERVE_ENGINE": "simulated",
        "TPUSERVE_MODEL": "hf://Qwen/Qwen3-8B",
        "TPUSERVE_SERVED_MODEL_NAME": "qwen",
        "TPUSERVE_WEIGHTS_CACHE_DIR": "/nonexistent/never-used",
        "TPUSERVE_TPU_GENERATION": "tpu7x",
        "TPUSERVE_TPU_TOPOLOGY": "2x2x2",
        "TPUSERVE_HOSTS": "2",
        "TPUSERVE_CHIPS_PER_HOST": "4",
        "TPUSERVE_HOST_INDEX": str(host),
        "TPUSERVE_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.2",
        "TPUSERVE_BIND_HOST": "127.0.0.1",
        "TPUSERVE_HTTP_PORT": str(http_port),
        "TPUSERVE_KV_EVENTS_PORT": str(kv_port),
        "TPUSERVE_DRAIN_TIMEOUT_SECONDS": "20",
    }


def test_leader_serves_the_engine_twin_and_drains_on_sigterm() -> None:
    http_port, kv_port = contract_ports(2, lambda ports: contract(0, *ports))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tpuserve", "engine", "launch"],
        env=contract(0, http_port, kv_port),
    )
    try:
        url = f"http://127.0.0.1:{http_port}"
        wait_healthy(url, launcher)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30)
        assert [m.id for m in client.models.list().data] == ["qwen"]
        completion = client.completions.create(model="qwen", prompt="Hello", max_tokens=4)
        assert completion.choices[0].text
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=DEADLINE_SECONDS) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def test_the_contracts_lora_adapters_are_served_and_routed() -> None:
    http_port, kv_port = contract_ports(2, lambda ports: contract(0, *ports))
    router_port = free_port()
    adapters = "sql=hf://org/sql-lora,law=pvc://adapters/law"
    env = contract(0, http_port, kv_port) | {"TPUSERVE_LORA_ADAPTERS": adapters}
    launcher = subprocess.Popen([sys.executable, "-m", "tpuserve", "engine", "launch"], env=env)
    router = None
    try:
        url = f"http://127.0.0.1:{http_port}"
        wait_healthy(url, launcher)
        engine = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30)
        cards = engine.models.list().data
        assert [(m.id, getattr(m, "parent", None)) for m in cards] == [
            ("qwen", None),
            ("sql", "qwen"),
            ("law", "qwen"),
        ]
        worker = f"qwen={url}"
        router = subprocess.Popen(
            [sys.executable, "-m", "tpuserve", "router", "--port", str(router_port),
             "--host", "127.0.0.1", "--worker", worker],
            env={k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")},
        )  # fmt: skip
        front = f"http://127.0.0.1:{router_port}"
        client = openai.OpenAI(base_url=f"{front}/v1", api_key="unused", timeout=30)

        def lists_adapters() -> bool:
            assert router is not None
            assert router.poll() is None, "the router exited"
            ids = [m.id for m in client.models.list().data]
            return ids == ["qwen", "qwen:law", "qwen:sql"]  # adapters in name order

        eventually(
            lists_adapters,
            what="the router's /v1/models to list qwen:sql and qwen:law",
            timeout_seconds=DEADLINE_SECONDS,
            ignore=(openai.APIConnectionError,),
        )
        completion = client.completions.create(model="qwen:sql", prompt="Hi", max_tokens=2)
        assert completion.choices[0].text
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="qwen:tax", prompt="Hi", max_tokens=2)
    finally:
        if router is not None:
            stop(router)
        stop(launcher)


def test_follower_holds_its_place_without_serving_and_stops_on_sigterm() -> None:
    http_port, kv_port = contract_ports(2, lambda ports: contract(1, *ports))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tpuserve", "engine", "launch"],
        env=contract(1, http_port, kv_port),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stderr = launcher.stderr
        assert stderr is not None

        def started_holder() -> bool:  # the launcher logs the command it starts
            line = stderr.readline()
            assert line, "the launcher exited before starting its command"
            return "starting: sleep infinity" in line

        eventually(
            started_holder,
            what="the launcher to start `sleep infinity`",
            timeout_seconds=DEADLINE_SECONDS,
            interval_seconds=0,
        )
        assert launcher.poll() is None
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.0.1", http_port), 1),
        ):
            pass
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=DEADLINE_SECONDS) == 128 + signal.SIGTERM
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
