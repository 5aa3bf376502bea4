"""`tpuserve up` starts engines and the router, drives a load, and stops cleanly on Ctrl-C.

The tests read `tpuserve up --json`'s status lines on stdout (one JSON object per line,
`tpuserve/up/status.py`); the live table on stderr is for people.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

pytestmark = pytest.mark.component

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
UP = [sys.executable, "-c", ENTRY, "up", "--workers", "2", "--port", "0", "--time-scale", "0"]


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def next_event(stdout: IO[str], stderr_log: Path) -> dict[str, Any]:
    line = stdout.readline()
    assert line, f"tpuserve up exited without a status line:\n{stderr_log.read_text()[-3000:]}"
    event: dict[str, Any] = json.loads(line)
    return event


def test_up_drives_a_load_and_exits_when_it_is_done() -> None:
    result = subprocess.run(
        [*UP, "--json", "--load", "shared-prefix", "--rate", "50", "--requests", "40"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "OpenAI base URL: http://127.0.0.1:" in result.stderr  # the table is still shown
    seen = events(result.stdout)
    ready = seen[0]
    assert ready["event"] == "ready"
    assert ready["base_url"] == ready["router"] + "/v1"
    assert ready["router"].startswith("http://127.0.0.1:")
    assert len(ready["workers"]) == 2
    assert seen[-1] == {"event": "stopped", "exit_code": 0, "exited": []}
    last_load = [e for e in seen if e["event"] == "load"][-1]
    assert (last_load["load"], last_load["policy"]) == ("shared-prefix", "default")
    assert (last_load["sent"], last_load["done"], last_load["failed"]) == (40, 40, 0)
    assert last_load["in_flight"] == 0
    assert last_load["prefix_hit_rate"] > 0.5  # the load's prefixes are shared


def test_ctrl_c_stops_the_fleet(tmp_path: Path) -> None:
    stderr_log = tmp_path / "stderr"
    with stderr_log.open("w") as stderr:
        proc = subprocess.Popen([*UP, "--json"], stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    try:
        ready = next_event(proc.stdout, stderr_log)
        assert ready["event"] == "ready", ready
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, stderr_log.read_text()[-3000:]
        assert next_event(proc.stdout, stderr_log) == {
            "event": "stopped",
            "exit_code": 0,
            "exited": [],
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_bad_flags_name_the_flag() -> None:
    result = subprocess.run(
        [*UP, "--load", "nope", "--policy", "best"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--load 'nope': allowed" in result.stderr
    assert "--policy 'best': allowed" in result.stderr
    assert result.stdout == ""  # status lines only with --json
    result = subprocess.run([*UP, "--workers", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "argument --workers: '0' is not allowed; allowed: an integer >= 1" in result.stderr


def test_bad_flags_with_json_give_one_error_line() -> None:
    result = subprocess.run(
        [*UP, "--json", "--load", "nope"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    (error,) = events(result.stdout)
    assert error["event"] == "error"
    assert "--load 'nope': allowed" in error["message"]
