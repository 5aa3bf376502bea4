"""What the TPU lane's tests share: the commands they run against the chip, as processes.

The pytest process never imports torch or torch_tpu: one process at a time can hold a TPU,
so every look at the chip is a process of its own that exits before the next one starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "sglang_tpu" / "preflight_probe.py"
PROBE_MARKER = "TPUSERVE_PREFLIGHT_PROBE"
TIMEOUT_SECONDS = 600
V5E_HBM_BYTES = 17179869184  # get_device_properties().total_memory on the v5e


def contract(generation: str = "v5e", topology: str = "1x1", **extra: str) -> dict[str, str]:
    """A one-host launch contract (v5e 1x1 is the lane's chip)."""
    return {
        "TPUSERVE_MODEL": "/models/none",
        "TPUSERVE_TPU_GENERATION": generation,
        "TPUSERVE_TPU_TOPOLOGY": topology,
        "TPUSERVE_HOSTS": "1",
        "TPUSERVE_CHIPS_PER_HOST": "1",
        "TPUSERVE_HOST_INDEX": "0",
        "TPUSERVE_SGLANG_PYTHON": sys.executable,
        **extra,
    }


def environment(without_shim: bool = False, **values: str) -> dict[str, str]:
    """This process's environment less any contract, plus `values`; `without_shim` drops the
    lane's libtpu shim from PYTHONPATH (the machine's own libtpu metadata shows)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    shim = os.environ.get("TPU_LANE_SHIM")
    if without_shim and shim:
        parts = env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p != shim)
    return env | values


@dataclass(frozen=True)
class Preflight:
    returncode: int
    report: dict[str, Any]
    stderr: str
    termination_message: str | None


def preflight(tmp_path: Path, env: dict[str, str]) -> Preflight:
    """`tpuserve engine preflight --json` as a process, with the termination message file."""
    message = tmp_path / "termination-log"
    env = env | {"TPUSERVE_TERMINATION_MESSAGE_PATH": str(message)}
    done = subprocess.run(
        [sys.executable, "-m", "tpuserve", "engine", "preflight", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1]) if lines else {}
    text = message.read_text() if message.exists() else None
    return Preflight(done.returncode, report, done.stderr[-4000:], text)


def probe_device(env: dict[str, str]) -> dict[str, Any]:
    """The pre-flight's device probe, run by this interpreter with `env`."""
    done = subprocess.run(
        [sys.executable, str(PROBE), "device"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(PROBE_MARKER + " "):
            found: dict[str, Any] = json.loads(line[len(PROBE_MARKER) + 1 :])
            return found
    raise AssertionError(f"no answer (exit {done.returncode}); stderr:\n{done.stderr[-4000:]}")
