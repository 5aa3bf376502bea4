"""`tpuserve router` as a process: settings from flags and environment, clear errors, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component

ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"
ROUTER = [sys.executable, "-c", ENTRY, "router"]


def test_bad_settings_exit_2_naming_each_one() -> None:
    env = {**os.environ, "TPUSERVE_ROUTER_POLICY": "fastest", "TPUSERVE_ROUTER_PORT": "http"}
    result = subprocess.run(
        [*ROUTER, "--worker", "ftp://x:1"], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 2
    assert "TPUSERVE_ROUTER_PORT: 'http' is not allowed; allowed: an integer" in result.stderr
    assert "TPUSERVE_ROUTER_POLICY='fastest': allowed cache_aware" in result.stderr
    assert "ftp://x:1" in result.stderr


def test_a_bad_flag_exits_2_naming_it() -> None:
    result = subprocess.run([*ROUTER, "--port", "http"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "argument --port: 'http' is not allowed; allowed: an integer" in result.stderr


def test_it_serves_from_environment_settings_and_stops_on_sigterm() -> None:
    port = free_port()
    env = {**os.environ, "TPUSERVE_ROUTER_PORT": str(port),
           "TPUSERVE_ROUTER_WORKERS": "http://127.0.0.1:9"}  # fmt: skip
    proc = subprocess.Popen([*ROUTER], stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    try:
        deadline = time.monotonic() + 30
        for line in proc.stderr:
            if "listening on" in line:
                assert f"http://127.0.0.1:{port}" in line
                break
            assert time.monotonic() < deadline
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/workers", timeout=5) as response:
            assert b"http://127.0.0.1:9" in response.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
