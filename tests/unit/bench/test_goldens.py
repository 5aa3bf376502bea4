"""Published seeded figures pinned to the code (bench/goldens.py).

Each reduced seeded run must give its golden's figures, and each published docs table must be
what its committed results file renders. When a change moves them on purpose, rewrite both
with ``.venv/bin/python bench/goldens.py --write`` (``--full`` also reruns the full runs).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

HOW = "if the change is meant, run: .venv/bin/python bench/goldens.py --write"


def _load() -> ModuleType:
    return load_bench_script("goldens", "bench_goldens")


goldens = _load()


@pytest.mark.parametrize("name", sorted(goldens.FIGURES))
def test_a_seeded_figure_equals_its_golden(name: str) -> None:
    golden = json.loads(goldens.golden_path(name).read_text())
    run = goldens._normalise(goldens.FIGURES[name]())
    diff = goldens.differences(golden, run)
    assert diff == [], f"{name} moved ({HOW}):\n" + "\n".join(diff[:20])


@pytest.mark.parametrize("name", sorted(goldens.TABLES))
def test_a_docs_table_is_what_its_results_file_renders(name: str) -> None:
    table = goldens.TABLES[name]
    assert goldens.block(table.page.read_text(), goldens.block_name(name)) == table.render(), HOW


def test_a_moved_figure_is_reported_where_it_moved() -> None:
    golden: dict[str, Any] = json.loads(goldens.golden_path("fleet_hour").read_text())
    moved = copy.deepcopy(golden)
    moved["summary"]["ttft_p99"] *= 1.001
    moved["summary"]["requests"] += 1
    assert goldens.differences(golden, moved) == [
        f"/summary/requests: {golden['summary']['requests']!r} -> {moved['summary']['requests']!r}",
        f"/summary/ttft_p99: {golden['summary']['ttft_p99']!r} -> {moved['summary']['ttft_p99']!r}",
    ]
    assert goldens.differences(golden, goldens._normalise(golden)) == []


def test_the_regenerate_command_rewrites_a_changed_table(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- golden:x:begin -->\n| old |\n<!-- golden:x:end -->\nafter\n")
    text = goldens.replace_block(page.read_text(), "x", "| new |\n|---|")
    assert text == "before\n<!-- golden:x:begin -->\n| new |\n|---|\n<!-- golden:x:end -->\nafter\n"
    with pytest.raises(ValueError, match="golden:y:begin"):
        goldens.block(text, "y")
