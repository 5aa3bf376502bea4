"""The docs index, the large-modules list and the docs' measured figures stay true to the tree.

docs/README.md names every page of docs/; docs/development.md's table of modules over 500 lines
names every such module (and none under 400: one that shrank leaves the list); no tracked
file sends a reader to the team's notes outside the repository; and every measured figure in
README.md and docs/ is generated from a results file or dated with its command. (The router
CPU headline is one generated block on two pages: bench/goldens.py, ``router-cpu``.)
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


# ---- measured figures: generated or dated with their command -------------------------------

FIGURE = re.compile(
    r"(?<![\w.])\d(?:[\d,.]*\d)?(?:[-–]\d[\d,.]*)?\s?"
    r"(?:×|ms\b|µs\b|us\b|req/s\b|tokens/s\b|tok/s\b|min\b|minutes\b|GB\b)"
)
"""A measured figure, by its unit: a ratio (×), a latency (ms, µs), a rate (req/s, tokens/s),
a build or install (minutes, GB). Plain seconds and percentages are left out: most of them in
these pages are settings (timeouts, windows, thresholds), not measurements."""
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMAND = re.compile(
    r"`[^`\n]*(?:python|bench/|tpuserve |make |pytest|scripts/|kubectl |helm )[^`\n]*`|^```",
    re.MULTILINE,
)
GENERATED = re.compile(
    r"<!-- (golden:[\w-]+:begin|generated:[\w-]+) -->.*?"
    r"<!-- (golden:[\w-]+:end|/generated:[\w-]+) -->",
    re.DOTALL,
)
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
UNDATED = Path(__file__).with_name("undated_figures.txt")
"""Paragraphs with figures that were neither generated nor dated when this check came in
(page and the paragraph's first line): each is to be dated, generated or reworded, and then
leaves the list. No paragraph may join it."""


def undated_figures(page: str, text: str) -> list[str]:
    """``page: first line`` of each paragraph of ``text`` that has a measured figure outside a
    generated block and sits in a section (heading to heading) without both a date and a
    command, nor a date of its own."""
    found = []
    for section in re.split(r"\n(?=#{1,6} )", GENERATED.sub("", text)):
        if DATE.search(section) and COMMAND.search(section):
            continue
        for paragraph in re.split(r"\n\s*\n", FENCE.sub("", section)):
            head = paragraph.strip()
            if head.startswith("#") or not FIGURE.search(paragraph) or DATE.search(paragraph):
                continue
            found.append(f"{page}: {head.splitlines()[0][:80]}")
    return found


def figure_pages() -> dict[str, str]:
    pages = {"README.md": (REPO / "README.md").read_text()}
    pages |= {f"docs/{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))}
    return pages


def test_every_figure_in_the_docs_is_generated_or_dated() -> None:
    allowed = [line for line in UNDATED.read_text().splitlines() if line and line[0] != "#"]
    found = [u for page, text in figure_pages().items() for u in undated_figures(page, text)]
    new = [u for u in found if u not in allowed]
    assert new == [], (
        "figures neither generated (bench/goldens.py) nor dated with their command "
        "(a YYYY-MM-DD date and the command in the paragraph or its section):\n" + "\n".join(new)
    )
    gone = [a for a in allowed if a not in found]
    assert gone == [], f"dated or gone now: drop from {UNDATED.name}:\n" + "\n".join(gone)


def test_the_figure_check_finds_an_undated_figure_and_accepts_a_dated_one() -> None:
    undated = "## Speed\n\nThe router adds 0.4 ms a request.\n"
    assert undated_figures("p.md", undated) == ["p.md: The router adds 0.4 ms a request."]
    dated = "## Speed\n\nThe router adds 0.4 ms a request (2026-12-07, `bench/x.py`).\n"
    assert undated_figures("p.md", dated) == []
    in_section = "## Speed\n\nMeasured 2026-12-07:\n\n```\npython bench/x.py\n```\n\nIt is 2×.\n"
    assert undated_figures("p.md", in_section) == []
    generated = "## Speed\n\n<!-- golden:x:begin -->\n| 1.1× |\n<!-- golden:x:end -->\n"
    assert undated_figures("p.md", generated) == []
    setting = "## Settings\n\nThe window is 30 s and the threshold 80 %.\n"
    assert undated_figures("p.md", setting) == []
