"""No module over 700 lines (docs/development.md, "Modules over 500 lines"): every tracked Python
file of the packages, the benchmarks and the tests keeps one job, and one that grows past the
limit is split by job, not trimmed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 700
ROOTS = (
    "router/tpuserve_router",
    "operator/tpuserve_operator",
    "tpuserve",
    "sglang_tpu",
    "bench",
    "scripts",
    "tests",
)


def tracked_python_files(repo: Path, roots: tuple[str, ...]) -> list[Path]:
    """The Python files git tracks under ``roots`` (relative to ``repo``)."""
    listed = subprocess.run(
        ["git", "ls-files", "--", *(f"{root}/*.py" for root in roots)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    return [repo / name for name in listed if (repo / name).is_file()]


def over_limit(paths: list[Path], limit: int, repo: Path) -> list[str]:
    """Each of ``paths`` longer than ``limit`` lines, as ``path (N lines)``."""
    found = []
    for path in sorted(paths):
        lines = len(path.read_bytes().splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(repo).as_posix()} ({lines} lines)")
    return found


def test_the_check_finds_a_module_over_the_limit(tmp_path: Path) -> None:
    short, exact, long = tmp_path / "short.py", tmp_path / "exact.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * 3)
    exact.write_text("x = 1\n" * 5)
    long.write_text("x = 1\n" * 6)
    assert over_limit([long, exact, short], 5, tmp_path) == ["long.py (6 lines)"]


def test_every_root_holds_tracked_python_files() -> None:
    files = tracked_python_files(REPO, ROOTS)
    for root in ROOTS:
        assert any(f.is_relative_to(REPO / root) for f in files), f"no tracked .py under {root}"


def test_no_module_is_over_700_lines() -> None:
    over = over_limit(tracked_python_files(REPO, ROOTS), MAX_LINES, REPO)
    assert over == [], f"over {MAX_LINES} lines: split each by job (one job per module)"
