"""The launcher forwards SIGTERM, waits for the drain, kills overstayers, returns the status.

The launcher is a real process running `supervise` on a small Python server stand-in; the
stand-in reports on stdout when its signal handling is installed, so the test signals the
launcher only once the child is ready (no sleeps).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from sglang_tpu.launch import supervise
from tests.waiting import eventually

pytestmark = pytest.mark.component

DEADLINE_SECONDS = 60


def start_launcher(child_code: str, drain_seconds: float) -> subprocess.Popen[str]:
    child = [sys.executable, "-u", "-c", textwrap.dedent(child_code)]
    supervisor = (
        "import os, sys; from sglang_tpu.launch import supervise; "
        f"sys.exit(supervise({child!r}, dict(os.environ), {drain_seconds}))"
    )
    return subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE, text=True)


def read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    assert line, "the child exited before reporting"
    return line


def running(pid: int) -> bool:
    """False once the process is gone or a zombie (killed, waiting for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int) -> None:
    eventually(
        lambda: not running(pid), what=f"process {pid} to be gone", timeout_seconds=DEADLINE_SECONDS
    )


DRAINS_ON_SIGTERM = """
    import signal, sys
    def drain(signum, frame):
        print("draining", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    print("ready", flush=True)
    signal.pause()
"""

IGNORES_SIGTERM = """
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    helper = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    print(helper.pid, flush=True)
    signal.pause()
"""


def test_sigterm_is_forwarded_and_the_childs_status_returned() -> None:
    launcher = start_launcher(DRAINS_ON_SIGTERM, drain_seconds=30)
    assert read_line(launcher) == "ready"
    launcher.send_signal(signal.SIGTERM)
    assert read_line(launcher) == "draining"
    assert launcher.wait(timeout=DEADLINE_SECONDS) == 0


def test_a_server_that_overstays_the_drain_is_killed_with_its_process_group() -> None:
    launcher = start_launcher(IGNORES_SIGTERM, drain_seconds=0.5)
    helper_pid = int(read_line(launcher))
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=DEADLINE_SECONDS) == 128 + signal.SIGKILL
    wait_gone(helper_pid)


REPORTS_ITS_PID = """
    import os, signal
    print(os.getpid(), flush=True)
    signal.pause()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launcher_killed_outright_takes_its_server_with_it() -> None:
    launcher = start_launcher(REPORTS_ITS_PID, drain_seconds=30)
    server_pid = int(read_line(launcher))
    assert running(server_pid)
    launcher.kill()  # SIGKILL: nothing is forwarded, the server is in a session of its own
    assert launcher.wait(timeout=DEADLINE_SECONDS) == -signal.SIGKILL
    wait_gone(server_pid)


def test_a_crashing_server_status_is_returned_without_a_signal() -> None:
    launcher = start_launcher("import sys; print('ready', flush=True); sys.exit(3)", 30)
    assert read_line(launcher) == "ready"
    assert launcher.wait(timeout=DEADLINE_SECONDS) == 3


def test_a_server_that_cannot_start_gives_127() -> None:
    assert supervise(["/nonexistent/sglang-server"], {}, 1.0) == 127
