"""bench/image_python_venv.sh: a flavour it does not build is refused before any work."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "image_python_venv.sh"


def test_an_unknown_flavour_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "pgo"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TPUSERVE_CACHE": str(tmp_path)},
    )
    assert done.returncode == 2
    assert "flavour 'pgo' is not one of: image, plain" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing downloaded or built
