"""Cold and warm compiles of one decoder step on the chip, with the launcher's cache variables.

Four processes compile the same Qwen3-0.6B-shaped decode step (batch 8 x 1,024 context,
`tests/tpu/decoder_step.py`) with exactly the environment `tpuserve engine launch` gives
SGLang for a compile cache (`compile_cache.compile_cache_env` and the tier-2 name), as a new
pod would: TorchTPU's shared-memory tier 2 (`/dev/shm/torch_tpu_cache`) and PyTorch's default
cache under /tmp are emptied before each.

1. cold: an empty volume;
2. warm: the volume as run 1 left it (the ratio to run 1 is the issue's number);
3. tier 3 only: the volume without `inductor/`;
4. PyTorch's caches only: the volume without `torch_tpu/`.

What each store holds after each run is recorded with the times. The assertions are about the
stores, never about time: the volume fills, and the second process finds it.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tpu import chip

pytestmark = pytest.mark.tpu

RecordProperty = Callable[[str, object], None]
STEP = Path(__file__).with_name("decoder_step.py")
MARKER = "TPUSERVE_DECODER_STEP"
SHM_CACHE = Path("/dev/shm/torch_tpu_cache")
LAYERS = int(os.environ.get("TPU_LANE_DECODER_LAYERS", "28"))


def launcher_cache_env(volume: Path) -> dict[str, str]:
    """The compile-cache variables the launcher sets for a v5e 1x1 server on `volume`."""
    from sglang_tpu import compile_cache
    from sglang_tpu.contract.launch_contract import LaunchContract

    contract = LaunchContract.from_env(chip.contract(TPUSERVE_COMPILE_CACHE_DIR=str(volume)))
    return compile_cache.compile_cache_env(contract) | compile_cache.tier2_cache_env()


def default_inductor_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"


def size(path: Path) -> dict[str, int]:
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def stores(env: dict[str, str]) -> dict[str, dict[str, int]]:
    return {
        "tier3 (volume torch_tpu/)": size(Path(env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"])),
        "inductor (volume inductor/)": size(Path(env["TORCHINDUCTOR_CACHE_DIR"])),
        "tier2 (/dev/shm/torch_tpu_cache)": size(SHM_CACHE),
        "default inductor (/tmp)": size(default_inductor_dir()),
        "home cache (~/.cache)": size(Path.home() / ".cache"),
    }


def compile_once(env: dict[str, str]) -> dict[str, Any]:
    """A new process's first call of the step, as a new pod would make it."""
    shutil.rmtree(SHM_CACHE, ignore_errors=True)
    shutil.rmtree(default_inductor_dir(), ignore_errors=True)
    done = subprocess.run(
        [sys.executable, str(STEP), "--layers", str(LAYERS)],
        env=chip.environment() | env,
        capture_output=True,
        text=True,
        timeout=chip.TIMEOUT_SECONDS,
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER + " "):
            result: dict[str, Any] = json.loads(line[len(MARKER) + 1 :])
            result["stores_after"] = stores(env)
            result["stderr_tail"] = done.stderr[-1500:]
            return result
    raise AssertionError(f"no answer (exit {done.returncode}); stderr:\n{done.stderr[-4000:]}")


def test_a_second_process_finds_the_launchers_compile_cache_warm(
    tmp_path: Path, record_property: RecordProperty
) -> None:
    volume = tmp_path / "volume"
    env = launcher_cache_env(volume)
    record_property("environment", env)
    tier3 = Path(env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"])
    inductor = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    runs: dict[str, Any] = {}
    try:
        runs["1 cold"] = compile_once(env)
        assert runs["1 cold"]["error"] is None, runs["1 cold"]
        assert size(tier3)["files"] > 0, "TorchTPU wrote nothing under the tier-3 root"
        record_property("tier3_fingerprint_dirs", sorted(p.name for p in tier3.iterdir()))
        runs["2 warm"] = compile_once(env)
        assert runs["2 warm"]["error"] is None, runs["2 warm"]
        kept = tmp_path / "kept"
        shutil.copytree(volume, kept)
        shutil.rmtree(inductor)
        runs["3 tier 3 only"] = compile_once(env)
        shutil.rmtree(volume)
        shutil.copytree(kept, volume)
        shutil.rmtree(tier3)
        runs["4 PyTorch caches only"] = compile_once(env)
    finally:
        record_property("runs", runs)
        cold = runs.get("1 cold", {}).get("first_call_s")
        warm = runs.get("2 warm", {}).get("first_call_s")
        if cold and warm:
            record_property("warm_over_cold", round(warm / cold, 3))
