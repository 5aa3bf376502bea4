"""The engine image's TPU entry (`python -m sglang_tpu.sglang_tpu_server`) on the CPU, with real
SGLang 0.5.23: the adapter applied in the server's process, SGLang's server on the one-process
engine answering over HTTP, on loopback TCP and on a unix socket (`TPUSERVE_SGLANG_UDS`, for
the TPU machine that refuses TCP).

The entry gets the command the launcher renders for the cpu device with the module swapped
(the TPU's command differs only in `--device tpu`, which needs a chip), and the engine image's
`TPUSERVE_SGLANG_KV_WRITES=eager`: the entry refuses to serve when that is not in effect.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import openai
import pytest

from sglang_tpu import launch, sglang_tpu_server
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.sglang_flags import SGLANG_MODULE, TPU_SGLANG_MODULE
from sglang_tpu.tpu_stack import KV_WRITES_ENV
from tests.contract_env import contract_env, contract_ports
from tests.real_sglang import REPO, RealSGLang
from tests.waiting import eventually
from tpuserve.cluster.ports import LOOPBACK
from tpuserve.cluster.process import tail

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

SERVED_NAME = "tiny"
START_TIMEOUT_SECONDS = 180.0
REQUEST_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 30.0
PREFIX = " ".join(str(n * 7919 % 10007) for n in range(120)) + "\n"


@dataclass
class EntryServer:
    process: subprocess.Popen[bytes]
    log: Path
    base_url: str
    uds: str | None

    def client(self) -> openai.OpenAI:
        transport = httpx2.HTTPTransport(uds=self.uds) if self.uds else None
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1",
            api_key="-",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_SECONDS,
            http_client=httpx2.Client(transport=transport, timeout=REQUEST_TIMEOUT_SECONDS),
        )

    def log_tail(self) -> str:
        return f"last lines of {self.log}:\n{tail(self.log, 60)}"


def children(pid: int) -> list[str]:
    """The command lines of `pid`'s child processes."""
    pids = [
        child
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    return [Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode() for c in pids]


def entry_command(real_sglang: RealSGLang, http_port: int, kv_port: int) -> list[str]:
    """The launcher's command for the cpu device, through the TPU's entry instead."""
    env = contract_env("v5e", "1x1", 1, 1, model=str(real_sglang.model)) | {
        "TPUSERVE_DEVICE": "cpu",
        "TPUSERVE_SGLANG_PYTHON": str(real_sglang.python),
        "TPUSERVE_SERVED_MODEL_NAME": SERVED_NAME,
        "TPUSERVE_BIND_HOST": LOOPBACK,
        "TPUSERVE_HTTP_PORT": str(http_port),
        "TPUSERVE_KV_EVENTS_PORT": str(kv_port),
    }
    command = launch.plan(LaunchContract.from_env(env)).command
    assert command[1:3] == list(SGLANG_MODULE)
    return [command[0], *TPU_SGLANG_MODULE, *command[3:]]


@pytest.fixture(scope="module", params=["tcp", "unix socket"])
def entry(
    request: pytest.FixtureRequest,
    real_sglang: RealSGLang,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EntryServer]:
    run_dir = tmp_path_factory.mktemp("entry")
    http_port, kv_port = contract_ports(
        2,
        lambda ports: (
            contract_env("v5e", "1x1", 1, 1)
            | {"TPUSERVE_HTTP_PORT": str(ports[0]), "TPUSERVE_KV_EVENTS_PORT": str(ports[1])}
        ),
    )
    env = real_sglang.environment()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{REPO}"
    env[KV_WRITES_ENV] = "eager"  # as the engine image declares it
    uds = str(run_dir / "engine.sock") if request.param == "unix socket" else None
    if uds:
        env[sglang_tpu_server.UDS_ENV] = uds
    base_url = "http://engine" if uds else f"http://{LOOPBACK}:{http_port}"
    log = run_dir / "entry.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            entry_command(real_sglang, http_port, kv_port),
            env=env,
            cwd=run_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = EntryServer(process, log, base_url, uds)
    try:

        def serving() -> bool:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the entry exited with {process.returncode}; {server.log_tail()}"
                )
            try:
                with server.client() as api:
                    return bool(api.models.list().data)
            except openai.APIConnectionError:
                return False

        eventually(
            serving,
            what=f"the entry's SGLang server ({request.param}) to list its models",
            timeout_seconds=START_TIMEOUT_SECONDS,
            interval_seconds=0.5,
            context=server.log_tail,
        )
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()


def test_the_entry_serves_sglangs_api_with_the_adapter_applied(entry: EntryServer) -> None:
    with entry.client() as api:
        assert [m.id for m in api.models.list().data] == [SERVED_NAME]
        usages = []
        for question in ("first?", "second?"):
            completion = api.completions.create(
                model=SERVED_NAME, prompt=PREFIX + question, max_tokens=4, temperature=0
            )
            assert completion.choices[0].text
            assert completion.usage is not None
            usages.append(completion.usage)
    # the radix cache of the one-process engine's scheduler thread holds the shared prefix
    details = usages[1].prompt_tokens_details
    assert details is not None
    assert details.cached_tokens is not None
    assert details.cached_tokens >= usages[1].prompt_tokens // 2
    log = entry.log.read_text(errors="replace")
    assert "TorchTPU adapter applied: KV pool writes eager; host cumsum" in log
    # one process: SGLang's scheduler and detokenizer are threads, not child processes (the
    # one child is multiprocessing's resource tracker, for the shared memory SGLang names)
    assert all("resource_tracker" in c for c in children(entry.process.pid))


def test_the_adapter_is_in_effect_in_sglang(real_sglang: RealSGLang) -> None:
    """`apply_adapter` against real SGLang: the patches are SGLang's, not stand-ins."""
    script = (
        "from sglang_tpu import sglang_tpu_server as s\n"
        "import sglang.srt.layers.logits_processor as lp\n"
        "print(s.kv_writes_in_effect(), end=' ')\n"
        "a = s.apply_adapter()\n"
        "print(s.kv_writes_in_effect(), type(lp.torch).__name__, a.kv_writes)\n"
    )
    env = real_sglang.environment()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{REPO}"
    done = subprocess.run(
        [str(real_sglang.python), "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=START_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["graph", "eager", "_HostIntegerCumsum", "eager"]
