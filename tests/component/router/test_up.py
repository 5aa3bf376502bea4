"""`tpuserve up` starts engines and the router, drives a load, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.component

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
UP = [sys.executable, "-c", ENTRY, "up", "--workers", "2", "--port", "0", "--time-scale", "0"]


def test_up_drives_a_load_and_exits_when_it_is_done() -> None:
    result = subprocess.run(
        [*UP, "--load", "shared-prefix", "--rate", "50", "--requests", "40"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "OpenAI base URL: http://127.0.0.1:" in result.stderr
    last_row = [line for line in result.stderr.splitlines() if line.startswith("│")][-1]
    cells = [c.strip() for c in last_row.strip("│").split("│")]
    done, failed = int(cells[-2]), int(cells[-1])
    assert (done, failed) == (40, 0)
    hit_rate = cells[2]
    assert float(hit_rate.rstrip("%")) > 50  # the load's prefixes are shared


def test_ctrl_c_stops_the_fleet() -> None:
    proc = subprocess.Popen(UP, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if "Ctrl-C stops everything" in line:
            break
        assert time.monotonic() < deadline
    assert "Ctrl-C stops everything" in seen[-1], "".join(seen)[-3000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]


def test_bad_flags_name_the_flag() -> None:
    result = subprocess.run(
        [*UP, "--load", "nope", "--policy", "best"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--load 'nope': allowed" in result.stderr
    assert "--policy 'best': allowed" in result.stderr
    result = subprocess.run([*UP, "--workers", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "argument --workers: '0' is not allowed; allowed: an integer >= 1" in result.stderr
