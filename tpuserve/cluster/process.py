"""Child processes of the local control plane: start with a log file, wait, stop.

A process is identified by pid plus its kernel start time, so a `tpuserve cluster down` run
long after `up` never signals an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

STOP_GRACE_SECONDS = 10.0
POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1


class StartupError(RuntimeError):
    """A component exited or did not become ready before its deadline."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Ask Linux to SIGTERM this child when the process that started it dies (pytest killed)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), or None if there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it follow the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ManagedProcess:
    """One running component. `popen` is None when re-attached from a state file."""

    name: str
    argv: list[str]
    log_path: Path
    pid: int
    start_time: int | None
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        detach: bool = False,
    ) -> ManagedProcess:
        """Start argv with stdout+stderr appended to log_path.

        Detached processes get their own session and outlive the caller (`cluster up`);
        attached ones also die with the caller, so a killed pytest leaves nothing behind.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"==== {time.strftime('%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=detach,
                preexec_fn=None if detach or sys.platform != "linux" else _die_with_parent,
                close_fds=True,
            )
        return cls(name, list(argv), log_path, popen.pid, process_start_time(popen.pid), popen)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        current = process_start_time(self.pid)
        if current is None or current != self.start_time:
            return False
        # A zombie has a start time but is gone for our purposes.
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        return False

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after grace_seconds; returns once the process is gone."""
        if not self.alive():
            self._reap()
            return
        self._signal(signal.SIGTERM)
        if self._wait_gone(grace_seconds):
            return
        self._signal(signal.SIGKILL)
        if not self._wait_gone(grace_seconds):
            raise RuntimeError(f"{self.name} (pid {self.pid}) survived SIGKILL")

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def _wait_gone(self, timeout_seconds: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(POLL_SECONDS)
        return not self.alive()

    def _reap(self) -> None:
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(0)

    def to_state(self) -> dict[str, object]:
        return {
            "name": self.name,
            "argv": self.argv,
            "log": str(self.log_path),
            "pid": self.pid,
            "start_time": self.start_time,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, object]) -> ManagedProcess:
        argv = data["argv"]
        start_time = data["start_time"]
        pid = data["pid"]
        assert isinstance(argv, list)
        assert isinstance(pid, int)
        assert start_time is None or isinstance(start_time, int)
        return cls(
            str(data["name"]), [str(a) for a in argv], Path(str(data["log"])), pid, start_time
        )


def wait_for(
    what: str,
    ready: Callable[[], bool],
    timeout_seconds: float,
    process: ManagedProcess | None = None,
) -> None:
    """Poll `ready` until it returns True; fail early, with the log tail, if `process` exits."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        if process is not None and not process.alive():
            raise StartupError(
                f"{process.name} exited (code {process.exit_code()}) before {what}; "
                f"last lines of {process.log_path}:\n{tail(process.log_path)}"
            )
        with contextlib.suppress(Exception):
            if ready():
                return
        if time.monotonic() >= deadline:
            log = (
                f"; last lines of {process.log_path}:\n{tail(process.log_path)}" if process else ""
            )
            raise StartupError(f"timed out after {timeout_seconds:.0f} s waiting for {what}{log}")
        time.sleep(POLL_SECONDS * 3)
