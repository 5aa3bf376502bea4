"""Start `tpuserve engine sim` as a real process on loopback, wait until it serves, and read
how many requests a twin is running."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.waiting import WaitTimeout, eventually

START_TIMEOUT_SECONDS = 30.0
ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"


@dataclass
class EngineProcess:
    proc: subprocess.Popen[str]
    url: str

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def start_engine(
    args: Sequence[str], env: Mapping[str, str] | None = None, log: Path | None = None
) -> EngineProcess:
    """`tpuserve engine sim --port 0 ARGS`, serving; `env` adds to this process's environment;
    its log (stderr) goes to ``log`` if given, else nowhere."""
    cmd = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", "0", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if log is None:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
    else:
        with log.open("w") as stderr:  # the child keeps its own copy
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    stdout = proc.stdout
    assert stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(stdout, selectors.EVENT_READ)

    def ready_url() -> str | None:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode} before serving")
        if sel.select(timeout=0):
            line = stdout.readline()
            if line.startswith("READY "):
                return line.split()[1]
        return None

    try:
        url = eventually(
            ready_url, what="the engine to print READY", timeout_seconds=START_TIMEOUT_SECONDS
        )
    except WaitTimeout:
        proc.kill()
        proc.wait()
        raise
    return EngineProcess(proc, url)


@contextmanager
def running_engine(
    args: Sequence[str], env: Mapping[str, str] | None = None, log: Path | None = None
) -> Iterator[EngineProcess]:
    engine = start_engine(args, env, log)
    try:
        yield engine
    finally:
        if engine.proc.poll() is None:
            engine.proc.kill()
            engine.proc.wait()


async def running_requests(session: aiohttp.ClientSession, url: str) -> int:
    """Requests the twin at `url` is running, from its ``/get_load``."""
    async with session.get(url + "/get_load") as response:
        return sum(item["num_reqs"] for item in await response.json())
