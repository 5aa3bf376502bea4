"""The generators' shared command: --check names stale and orphaned files and exits 1; a run
rewrites only what differs and deletes the orphans."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_tpu import generated_files

pytestmark = pytest.mark.unit

FILES = {Path("a/fresh.txt"): "fresh\n", Path("a/stale.txt"): "new\n", Path("b/new.txt"): "n\n"}


def run(root: Path, *argv: str) -> int:
    return generated_files.main(
        list(argv),
        description="test",
        module="some.generator",
        root=root,
        files=lambda: FILES,
        orphans=lambda: [Path("a/orphan.txt")] if (root / "a/orphan.txt").exists() else [],
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/fresh.txt").write_text("fresh\n")
    (tmp_path / "a/stale.txt").write_text("old\n")
    (tmp_path / "a/orphan.txt").write_text("gone\n")
    return tmp_path


def test_check_names_stale_missing_and_orphaned_files(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert generated_files.stale(FILES, root) == [Path("a/stale.txt"), Path("b/new.txt")]
    assert run(root, "--check") == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"stale: {p} (run python -m some.generator)"
        for p in ("a/stale.txt", "b/new.txt", "a/orphan.txt")
    ]
    assert (root / "a/stale.txt").read_text() == "old\n"  # --check writes nothing


def test_a_run_rewrites_what_differs_and_deletes_orphans(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(root) == 0
    assert capsys.readouterr().out.splitlines() == [
        "wrote a/stale.txt",
        "wrote b/new.txt",
        "removed a/orphan.txt",
    ]
    assert {p: (root / p).read_text() for p in FILES} == FILES
    assert not (root / "a/orphan.txt").exists()
    assert run(root, "--check") == 0
