"""One short GuideLLM pass through the real router in front of engine twins (bench/guidellm_run.py).

Runs only where GuideLLM is installed (``bench/guidellm_venv.sh``: GuideLLM 0.8.1 pulls torch
with its CUDA libraries, about 6 GB and several minutes from PyPI, so CI does not install it)
and the tiny model's tokenizer is built (scripts/install-real-sglang.sh). Everything stays on
loopback and offline (``HF_HUB_OFFLINE``): GuideLLM reads the tokenizer from that directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.component

VERSION = "0.8.1"


def _load() -> ModuleType:
    return load_bench_script("guidellm_run", "bench_guidellm_run")


def _guidellm_venv() -> Path:
    cache = Path(os.environ.get("TPUSERVE_CACHE", Path.home() / ".cache" / "tpuserve"))
    return Path(os.environ.get("TPUSERVE_GUIDELLM_VENV", cache / "bench" / f"guidellm-{VERSION}"))


def test_one_guidellm_pass_through_the_router(tmp_path: Path) -> None:
    if not (_guidellm_venv() / ".installed").exists():
        pytest.skip(f"GuideLLM {VERSION} is not installed: run bench/guidellm_venv.sh (~6 GB)")
    run = _load()
    try:
        tokenizer = run.tiny_tokenizer_dir()
    except SystemExit:
        pytest.skip("the tiny model's tokenizer is not built (scripts/install-real-sglang.sh)")
    out = tmp_path / "out"
    argv = [
        "--setups", "router:precise", "--workers", "2", "--rate", "4", "--max-seconds", "8",
        "--prefixes", "2", "--prefix-tokens", "256", "--prompt-tokens", "32",
        "--output-tokens", "16", "--time-scale", "0", "--tokenizer", str(tokenizer),
        "--out", str(out),
    ]  # fmt: skip
    assert run.main(argv) == 0
    [row] = json.loads((out / "summary.json").read_text())
    assert row["requests"] > 0
    assert row["failures"] == 0
    assert row["chips"] == 2
    assert row["output_tokens_per_second_per_chip"] > 0
    # The router's own counters (its /metrics) give the hit rate GuideLLM's per-request
    # cached tokens give, without a script: the same responses' usage.
    assert row["hit_rate"] > 0
    assert row["router_hit_rate"] == pytest.approx(row["hit_rate"], abs=0.1)
    report = json.loads((out / "router-precise.llmd-report.json").read_text())
    assert report["version"] == "0.1"
    assert report["scenario"]["load"]["name"] == "guidellm"
    assert report["metrics"]["requests"]["output_length"]["mean"] == 16  # GuideLLM: ignore_eos
    # GuideLLM counts the prompt from the engines' usage: the shared prefix, the request's own
    # tokens and the chat template's, all in the one tokenizer every part uses.
    assert report["metrics"]["requests"]["input_length"]["mean"] >= 256 + 32
    log = (out / "router-precise" / "guidellm.log").read_text()
    assert "Benchmarking complete" in log, log[-2000:]
