"""One short inference-perf pass through the real router in front of engine twins
(bench/inference_perf_run.py).

Runs only where inference-perf is installed (``bench/inference_perf_venv.sh``: its releases
need Python >= 3.12; CI does not install it) and the tiny model's tokenizer is built
(scripts/install-real-sglang.sh). Everything stays on loopback and offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.component

VERSION = "0.7.0"


def _load() -> ModuleType:
    return load_bench_script("inference_perf_run", "bench_inference_perf_run")


def _venv() -> Path:
    cache = Path(os.environ.get("TPUSERVE_CACHE", Path.home() / ".cache" / "tpuserve"))
    default = cache / "bench" / f"inference-perf-{VERSION}"
    return Path(os.environ.get("TPUSERVE_INFERENCE_PERF_VENV", default))


def test_one_inference_perf_pass_through_the_router(tmp_path: Path) -> None:
    if not (_venv() / ".installed").exists():
        pytest.skip(f"inference-perf {VERSION} is not installed: run bench/inference_perf_venv.sh")
    run = _load()
    try:
        tokenizer = run.shared.tiny_tokenizer_dir()
    except SystemExit:
        pytest.skip("the tiny model's tokenizer is not built (scripts/install-real-sglang.sh)")
    out = tmp_path / "out"
    argv = [
        "--setups", "router:precise", "--workers", "2", "--rate", "4", "--max-seconds", "6",
        "--workload", "shared-prefix", "--prefixes", "2", "--prefix-tokens", "256",
        "--prompt-tokens", "32", "--output-tokens", "16", "--time-scale", "0",
        "--tokenizer", str(tokenizer), "--out", str(out),
    ]  # fmt: skip
    assert run.main(argv) == 0
    [row] = json.loads((out / "summary.json").read_text())
    assert row["completed"] > 0
    assert row["failures"] == 0
    assert row["chips"] == 2
    assert row["output_tokens_per_second_per_chip"] > 0
    assert row["hit_rate"] > 0  # cached tokens from the engines' usage, through the router
    reports = out / "router-precise" / "reports"
    [partial] = sorted(reports.glob("inference-perf.partial.stage_*.yaml"))
    assert partial.read_text().startswith("version: 0.2")  # llm-d's benchmark report
