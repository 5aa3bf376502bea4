"""`tpuserve engine launch` on the cpu device starts real SGLang 0.5.23 from a launch contract.

The contract is the environment an operator would give a one-host pod (plus the cpu device,
the real-SGLang venv's interpreter, and the tiny model's directory as the model source), so
the launcher's command line, environment, model-source handling and signal forwarding run
against the real server: it serves the OpenAI routes under the contract's model name,
reports cached tokens (`--enable-cache-report`), publishes KV events on a port a subscriber
can reach (the endpoint binds), and a SIGTERM to the launcher stops the whole server.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import openai
import pytest
import zmq

from sglang_tpu.tokenizer import load_tokenizer
from tests.contract_env import contract_ports
from tests.real_sglang import RealSGLang
from tests.waiting import eventually
from tpuserve.cluster.ports import LOOPBACK
from tpuserve.cluster.process import tail

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

LAUNCHER = [sys.executable, "-c", "import sys; from tpuserve.cli import main; sys.exit(main())"]
SERVED_NAME = "tiny-llama"
START_TIMEOUT_SECONDS = 180.0
PROBE_TIMEOUT_SECONDS = 10.0  # one readiness probe: a port that accepts and never answers
STOP_TIMEOUT_SECONDS = 60.0
DRAIN_TIMEOUT_SECONDS = 30


@dataclass
class LaunchedServer:
    """A running `tpuserve engine launch` and where its SGLang server listens."""

    launcher: subprocess.Popen[bytes]
    log_path: Path
    url: str
    kv_port: int
    replay_port: int

    def log_tail(self) -> str:
        return f"last lines of {self.log_path}:\n{tail(self.log_path, 60)}"

    def server_pid(self) -> int | None:
        """The launcher's child: SGLang's main process, the leader of its own session."""
        children = Path(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children")
        try:
            pids = children.read_text().split()
        except OSError:
            return None
        return int(pids[0]) if pids else None


def contract_env(
    installed: RealSGLang, http_port: int, kv_port: int, replay_port: int
) -> dict[str, str]:
    """A one-host pod's launch contract, as the operator writes it, on the cpu device."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    return inherited | {
        "TPUSERVE_DEVICE": "cpu",
        "TPUSERVE_SGLANG_PYTHON": str(installed.python),
        "TPUSERVE_MODEL": str(installed.model),
        "TPUSERVE_SERVED_MODEL_NAME": SERVED_NAME,
        "TPUSERVE_TPU_GENERATION": "v6e",
        "TPUSERVE_TPU_TOPOLOGY": "1x1",
        "TPUSERVE_HOSTS": "1",
        "TPUSERVE_CHIPS_PER_HOST": "1",
        "TPUSERVE_HOST_INDEX": "0",
        "TPUSERVE_REPLICA_INDEX": "0",
        "TPUSERVE_BIND_HOST": LOOPBACK,
        "TPUSERVE_HTTP_PORT": str(http_port),
        "TPUSERVE_KV_EVENTS_PORT": str(kv_port),
        "TPUSERVE_KV_REPLAY_PORT": str(replay_port),
        "TPUSERVE_DRAIN_TIMEOUT_SECONDS": str(DRAIN_TIMEOUT_SECONDS),
        "TPUSERVE_POD_NAME": "tiny-llama-0",
    }


@pytest.fixture(scope="module")
def launched(
    real_sglang: RealSGLang, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LaunchedServer]:
    http_port, kv_port, replay_port = contract_ports(
        3, lambda ports: contract_env(real_sglang, *ports)
    )
    log_path = tmp_path_factory.mktemp("launch-cpu") / "launcher.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(
            [*LAUNCHER, "engine", "launch"],
            env=contract_env(real_sglang, http_port, kv_port, replay_port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = LaunchedServer(launcher, log_path, f"http://{LOOPBACK}:{http_port}", kv_port,
                            replay_port)  # fmt: skip
    started = time.monotonic()
    try:

        def healthy() -> bool:
            if launcher.poll() is not None:
                raise RuntimeError(
                    f"the launcher exited with {launcher.returncode}; {server.log_tail()}"
                )
            try:
                with openai.OpenAI(
                    base_url=f"{server.url}/v1",
                    api_key="-",
                    max_retries=0,
                    timeout=PROBE_TIMEOUT_SECONDS,
                ) as api:
                    return bool(api.models.list().data)
            except openai.APIConnectionError:  # refused, or timed out (its subclass)
                return False

        eventually(
            healthy,
            what=f"the launched SGLang server at {server.url} to list its models",
            timeout_seconds=START_TIMEOUT_SECONDS,
            interval_seconds=0.5,
            context=server.log_tail,
        )
        print(f"\nMEASURED launch to serving: {time.monotonic() - started:.1f} s")
        yield server
    finally:
        if launcher.poll() is None:  # a failed test: kill the launcher and the server's session
            pid = server.server_pid()
            launcher.kill()
            launcher.wait()
            with contextlib.suppress(ProcessLookupError):
                if pid is not None and os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)


def test_the_launched_server_serves_under_the_contracts_model_name_with_cache_report(
    launched: LaunchedServer, real_sglang: RealSGLang
) -> None:
    tokenizer = load_tokenizer(str(real_sglang.model / "tokenizer.json"))
    rng = random.Random(21)
    prefix = " ".join(str(rng.randrange(10**6)) for _ in range(150)) + "\n"
    with openai.OpenAI(base_url=f"{launched.url}/v1", api_key="-", max_retries=0) as api:
        assert [m.id for m in api.models.list().data] == [SERVED_NAME]
        usages = []
        for question in ("first?", "second?"):
            completion = api.completions.create(
                model=SERVED_NAME, prompt=prefix + question, max_tokens=4
            )
            assert completion.model == SERVED_NAME
            assert completion.usage is not None
            usages.append(completion.usage)
        chat = api.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert chat.choices[0].message.role == "assistant"
    second = usages[1]
    assert second.prompt_tokens == len(tokenizer.encode(prefix + "second?"))
    details = second.prompt_tokens_details
    assert details is not None, "the launcher passes --enable-cache-report"
    assert details.cached_tokens is not None
    assert details.cached_tokens >= len(tokenizer.encode(prefix)) // 2


def test_the_launched_server_publishes_kv_events_on_the_contracts_port(
    launched: LaunchedServer,
) -> None:
    context = zmq.Context()
    try:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://{LOOPBACK}:{launched.kv_port}")
        rng = random.Random(22)

        def stored_after_a_request() -> bool:
            # A subscription joins asynchronously: send fresh prompts until events arrive.
            prompt = " ".join(str(rng.randrange(10**6)) for _ in range(40))
            with openai.OpenAI(base_url=f"{launched.url}/v1", api_key="-", max_retries=0) as api:
                api.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=2)
            while sub.poll(timeout=2000):
                *_, payload = sub.recv_multipart()
                _ts, events, _rank = msgpack.unpackb(payload)
                if any(isinstance(e, dict) and e.get("type") == "BlockStored" for e in events):
                    return True
            return False

        eventually(
            stored_after_a_request,
            what="a BlockStored event on the contract's KV-event port",
            timeout_seconds=60,
            context=launched.log_tail,
        )
    finally:
        context.destroy(linger=0)


def test_sigterm_to_the_launcher_stops_the_whole_server(launched: LaunchedServer) -> None:
    """Runs last: it stops the module's server."""
    server_pid = launched.server_pid()
    assert server_pid is not None
    assert os.getpgid(server_pid) == server_pid, "the server leads its own process group"
    sent = time.monotonic()
    launched.launcher.send_signal(signal.SIGTERM)
    status = launched.launcher.wait(STOP_TIMEOUT_SECONDS)
    stopped_seconds = time.monotonic() - sent
    log = launched.log_path.read_text(errors="replace")
    print(f"\nMEASURED SIGTERM to launcher exit: {stopped_seconds:.1f} s, status {status}")
    print("\n".join(line for line in log.splitlines() if "SIGTERM" in line or "exit" in line))
    assert "received SIGTERM" in log, launched.log_tail()
    assert "SIGTERM received" in log, "the launcher forwarded it to SGLang"
    assert "did not exit within" not in log, "SGLang stopped within the drain timeout"
    assert status == 0, launched.log_tail()
    eventually(
        lambda: not live_members(server_pid),
        what="every process of the server's group to be gone",
        timeout_seconds=10,
        context=lambda: f"still running: {live_members(server_pid)}",
    )


def live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (a SIGKILLed orphan is one until
    init reaps it)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members
