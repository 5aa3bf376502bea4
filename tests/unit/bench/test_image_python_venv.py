"""bench/image_python_venv.sh: what it cannot build from is refused before any work."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "image_python_venv.sh"


def run(script: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TPUSERVE_CACHE": str(cache)},
    )


def test_an_unknown_flavour_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    done = run(SCRIPT, tmp_path, "pgo")
    assert done.returncode == 2
    assert "flavour 'pgo' is not one of: image, plain" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing downloaded or built


def test_a_checkout_without_its_venv_is_refused_before_any_build(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    for part in ("bench/image_python_venv.sh", "scripts/tool-paths.sh"):
        (checkout / part).parent.mkdir(parents=True, exist_ok=True)
        (checkout / part).write_text((SCRIPT.parents[1] / part).read_text())
    cache = tmp_path / "cache"
    cache.mkdir()
    done = run(checkout / "bench" / "image_python_venv.sh", cache)
    assert done.returncode == 2
    assert "no .venv/bin/python" in done.stderr
    assert "scripts/venv.sh dev" in done.stderr
    assert not any(cache.iterdir())  # nothing downloaded or built
