"""Start `tpuserve engine sim` as a real process on loopback and wait until it serves."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tpuserve.cluster.ports import free_port as free_port  # tests import it from here

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


def start_engine(args: Sequence[str]) -> EngineProcess:
    cmd = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", "0", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode} before serving")
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if line.startswith("READY "):
                return EngineProcess(proc, line.split()[1])
    proc.kill()
    proc.wait()
    raise RuntimeError("engine did not print READY in time")


@contextmanager
def running_engine(args: Sequence[str]) -> Iterator[EngineProcess]:
    engine = start_engine(args)
    try:
        yield engine
    finally:
        if engine.proc.poll() is None:
            engine.proc.kill()
            engine.proc.wait()
