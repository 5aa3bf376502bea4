"""docs/engine-sim.md's table of what the twin reproduces of SGLang names tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "engine-sim.md"
HEADING = "### What the twin reproduces of SGLang 0.5.23, and which test checks it"
TEST_REFERENCE = re.compile(r"`((?:[\w/]+/)?test_\w+\.py)(?:::(\w+))?`")


def table_rows() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(HEADING) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("| ") and not line.startswith("| behaviour"):
            rows.append(line)
    return rows


def test_every_row_names_a_test_that_exists() -> None:
    rows = table_rows()
    assert len(rows) >= 15
    for row in rows:
        references = TEST_REFERENCE.findall(row.rsplit("|", 2)[-2])
        assert references, f"names no test: {row}"
        for file_name, test in references:
            found = [p for p in (REPO / "tests").rglob(Path(file_name).name) if p.is_file()]
            assert found, f"{file_name} does not exist ({row})"
            if test:
                source = "".join(p.read_text() for p in found)
                assert re.search(rf"def {test}\(", source), f"{file_name} has no {test} ({row})"
