"""The docs index, the large-modules list and the router CPU figure stay true to the tree.

docs/README.md names every page of docs/; docs/development.md's table of modules over 500 lines
names every such module (and none under 400: one that shrank leaves the list); the CPU figure
under each `<!-- CPU-RATIO -->` marker reads the same on every page that carries it; and no
tracked file sends a reader to the team's notes outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SOURCE_ROOTS = (
    "sglang_tpu",
    "router/tpuserve_router",
    "router/native/src",
    "operator/tpuserve_operator",
    "tpuserve",
    "bench",
    "scripts",
)
LISTED_OVER = 500
KEPT_FROM = 400
CPU_MARKER = "<!-- CPU-RATIO -->"


def source_lines() -> dict[str, int]:
    found: dict[str, int] = {}
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*")):
            if path.suffix in (".py", ".rs") and path.is_file():
                found[path.relative_to(REPO).as_posix()] = len(path.read_bytes().splitlines())
    return found


def large_modules_table() -> list[str]:
    text = (DOCS / "development.md").read_text()
    start = text.index("Modules over 500 lines")
    end = text.index("\n## ", start)
    return re.findall(r"^\| `([^`]+)` \|", text[start:end], flags=re.MULTILINE)


def test_every_docs_page_is_in_the_index() -> None:
    index = (DOCS / "README.md").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    assert [p for p in pages if f"]({p})" not in index] == []
    linked = set(re.findall(r"\]\(([a-z0-9-]+\.md)\)", index))
    assert sorted(linked - set(pages)) == []  # no page named that is not there


def test_the_large_modules_list_is_true() -> None:
    lines = source_lines()
    listed = large_modules_table()
    assert listed, "docs/development.md: the table of modules over 500 lines is missing"
    unlisted = [f"{name} ({n} lines)" for name, n in lines.items() if n >= LISTED_OVER]
    unlisted = [u for u in unlisted if u.split(" ")[0] not in listed]
    assert unlisted == [], "add these to docs/development.md's list of modules over 500 lines"
    gone = [name for name in listed if name not in lines]
    assert gone == [], "docs/development.md lists modules that do not exist"
    small = [f"{name} ({lines[name]} lines)" for name in listed if lines[name] < KEPT_FROM]
    assert small == [], f"under {KEPT_FROM} lines: drop from docs/development.md's list"


def test_the_cpu_figure_reads_the_same_on_every_page() -> None:
    figures: dict[str, str] = {}
    for page in sorted(DOCS.glob("*.md")):
        lines = [*page.read_text().splitlines(), ""]
        for i, line in enumerate(lines[:-1]):
            if line.strip() == CPU_MARKER:
                figures[page.name] = lines[i + 1].strip()
                assert figures[page.name], f"{page.name}: no figure on the line after {CPU_MARKER}"
    assert {"router.md", "benchmarks.md"} <= figures.keys()
    assert len(set(figures.values())) == 1, figures


OUTSIDE = re.compile(r"\.\./shared|shared" + r"/(reference|design)")  # split: not a match itself
"""A path into the folder beside the checkout where the team keeps its reference notes: no
clone has it, so nothing in the repository may send a reader there."""
HISTORY = {"CHANGELOG.md"}  # what earlier releases said, kept as they said it


def test_nothing_in_the_repository_refers_to_files_outside_it() -> None:
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    found = []
    for relative in listed:
        path = REPO / relative
        if relative in HISTORY or relative.startswith("bench/tpu_results/") or not path.is_file():
            continue  # bench/tpu_results: measurement records, each with its own header
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{relative}:{n}" for n, line in enumerate(text.splitlines(), 1)
                  if OUTSIDE.search(line)]  # fmt: skip
    assert found == []
