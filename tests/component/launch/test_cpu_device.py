"""TPUSERVE_DEVICE=cpu end to end, with a stand-in for the interpreter that runs SGLang.

A real `tpuserve engine launch` process reads the contract, resolves the local model, and
starts `TPUSERVE_SGLANG_PYTHON -m sglang.launch_server ...`; the stand-in records the
arguments and environment it was started with and exits 3, which the launcher returns.
(Starting real SGLang on CPU needs its own environment: see docs/engine-launch.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

STAND_IN = """#!{python}
import json, os, sys
names = ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
         "CUDA_VISIBLE_DEVICES", "TPU_WORKER_ID")
seen = {{"argv": sys.argv[1:], "env": {{n: os.environ.get(n) for n in names}}}}
with open({record!r}, "w") as out:
    json.dump(seen, out)
sys.exit(3)
"""


def test_the_launcher_starts_sglang_on_cpu_with_the_shim_first(tmp_path: Path) -> None:
    record = tmp_path / "seen.json"
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    python.chmod(0o755)
    model = tmp_path / "tiny-llama"
    model.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUSERVE_")}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(Path.cwd()), "/inherited"]),
        "TPUSERVE_DEVICE": "cpu",
        "TPUSERVE_SGLANG_PYTHON": str(python),
        "TPUSERVE_CPU_KERNEL_SHIM_DIR": str(tmp_path / "shim"),
        "TPUSERVE_MODEL": str(model),
        "TPUSERVE_TPU_GENERATION": "v6e",
        "TPUSERVE_TPU_TOPOLOGY": "1x1",
        "TPUSERVE_HOSTS": "1",
        "TPUSERVE_CHIPS_PER_HOST": "1",
        "TPUSERVE_HOST_INDEX": "0",
        "TPUSERVE_BIND_HOST": "127.0.0.1",
    }
    launcher = [sys.executable, "-c", "import sys; from tpuserve.cli import main; sys.exit(main())"]
    result = subprocess.run(
        [*launcher, "engine", "launch"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == str(model)
    assert argv[argv.index("--device") + 1] == "cpu"
    assert "--enable-cache-report" in argv
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "shim")
    assert seen["env"]["PYTHONPATH"].endswith("/inherited")
    assert seen["env"] | {"PYTHONPATH": None} == {
        "PYTHONPATH": None,
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "TPU_WORKER_ID": None,
    }
