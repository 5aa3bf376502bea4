"""docs/sglang-jax.md stays true to the code: its tables are generated from the definitions.

The launcher's SGLang-JAX flags come from `sglang_tpu.sgl_jax_flags` and SGLang-JAX's own
server flags from `sglang_tpu.sgl_jax_server_args`; each table sits between marker comments.
Two more facts are checked, not generated: the table of tests that need the opt-in build names
exactly the test modules that use it, and the page names the one SGLang-JAX commit the image,
the build script and the flag table pin. After changing a definition, regenerate and review:

    TPUSERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/sglang_tpu/test_sgl_jax_docs.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sglang_tpu import sgl_jax_flags
from sglang_tpu.sgl_jax_server_args import SERVER_FLAGS, SOURCE_COMMIT

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "sglang-jax.md"
# What marks a test module as using the opt-in build (tests/real_sglang_jax.py).
USES_BUILD = re.compile(
    r"pytest\.mark\.real_sglang_jax|from tests\.real_sglang_jax import|TPUSERVE_SGLANG_JAX_SRC"
)
UPDATE = os.environ.get("TPUSERVE_UPDATE_GOLDEN") == "1"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def flag_table() -> str:
    lines = ["| flag | set from | note |", "|---|---|---|"]
    for f in sgl_jax_flags.FLAGS:
        names = ", ".join(f"`{n}`" for n in (f.name, *f.aliases))
        lines.append(f"| {names} | {cell(f.set_from)} | {cell(f.note)} |")
    return "\n".join(lines)


def default_table() -> str:
    lines = ["| flag | value | when | note |", "|---|---|---|---|"]
    for when, flags in (("always", sgl_jax_flags.DEFAULT_FLAGS), ("cpu", sgl_jax_flags.CPU_FLAGS)):
        for f in flags:
            lines.append(f"| `{f.name}` | `{f.set_from}` | {when} | {cell(f.note)} |")
    return "\n".join(lines)


def server_flags() -> str:
    owned = sgl_jax_flags.OWNED_FLAGS | sgl_jax_flags.SECRET_FLAGS
    lines = ["| flag | value | choices | set by the launcher |", "|---|---|---|---|"]
    for f in SERVER_FLAGS:
        names = ", ".join(f"`{n}`" for n in f.names)
        value = "switch" if f.kind == "switch" else f"{f.value_type} ({f.kind})"
        choices = ", ".join(f"`{c}`" for c in f.choices) if f.choices else ""
        mark = (
            "refused (a secret)"
            if set(f.names) & sgl_jax_flags.SECRET_FLAGS
            else ("yes" if set(f.names) & owned else "")
        )
        lines.append(f"| {names} | {value} | {cell(choices)} | {mark} |")
    return "\n".join(lines)


TABLES = {
    "sgl-jax-flag-table": flag_table,
    "sgl-jax-default-table": default_table,
    "sgl-jax-server-flags": server_flags,
}


def section(name: str, text: str) -> re.Match[str]:
    match = re.search(
        rf"(<!-- {name}: generated.*?-->\n)(.*?)(\n?<!-- /{name} -->)", text, re.DOTALL
    )
    assert match, f"docs/sglang-jax.md lacks the {name} markers"
    return match


@pytest.mark.parametrize("name", list(TABLES))
def test_generated_tables_are_current(name: str) -> None:
    text = DOC.read_text()
    match = section(name, text)
    expected = TABLES[name]()
    if UPDATE and match.group(2) != expected:
        DOC.write_text(
            text[: match.start(2)] + expected + "\n" + text[match.start(3) :].lstrip("\n")
        )
        match = section(name, DOC.read_text())
    assert match.group(2) == expected, "stale table; see this module's docstring"


def test_the_opt_in_table_names_every_test_that_needs_the_build() -> None:
    match = re.search(
        r"<!-- sgl-jax-opt-in-tests:.*?-->\n(.*?)<!-- /sgl-jax-opt-in-tests -->",
        DOC.read_text(),
        re.DOTALL,
    )
    assert match, "docs/sglang-jax.md lacks the sgl-jax-opt-in-tests markers"
    listed = set(re.findall(r"^\| `(tests/[^`]+\.py)`", match.group(1), re.MULTILINE))
    using = {
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if USES_BUILD.search(path.read_text()) and path != Path(__file__).resolve()
    }
    assert listed == using, (
        f"docs/sglang-jax.md's table of tests needing the opt-in build: missing "
        f"{sorted(using - listed)}, listed but not using it {sorted(listed - using)}"
    )


def test_one_sgl_jax_commit_in_the_docs_image_build_script_and_flag_table() -> None:
    (documented,) = re.findall(r"from source, commit\s+`([0-9a-f]{40})`", DOC.read_text())
    dockerfile = (REPO / "sglang_tpu" / "Dockerfile.sglang-jax").read_text()
    (image,) = re.findall(r"^ARG SGLANG_JAX_COMMIT=([0-9a-f]{40})$", dockerfile, re.MULTILINE)
    script = (REPO / "scripts" / "build-sglang-jax.sh").read_text()
    (built,) = re.findall(r"^PINNED_COMMIT=([0-9a-f]{40})$", script, re.MULTILINE)
    assert documented == image == built == SOURCE_COMMIT
