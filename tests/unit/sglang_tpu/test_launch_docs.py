"""docs/engine-launch.md stays true to the code: its tables are generated from the definitions.

The contract table comes from `sglang_tpu.contract.doc_rows.variables()`, the SGLang flag table
from `sglang_tpu.sglang_flags.FLAGS` and the cpu device's flags from `CPU_FLAGS`; each sits
between marker comments. After changing a definition, regenerate and review:

    TPUSERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/sglang_tpu/test_launch_docs.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sglang_tpu import launch, sglang_flags
from sglang_tpu.contract.doc_rows import variables
from sglang_tpu.contract.launch_contract import LaunchContract
from tests.contract_env import contract_env

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[3] / "docs" / "engine-launch.md"
UPDATE = os.environ.get("TPUSERVE_UPDATE_GOLDEN") == "1"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def contract_table() -> str:
    lines = [
        "| variable | scope | required | default | allowed | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for v in variables():
        default = f"`{v.default}`" if v.default else ""
        required = "yes" if v.required else ""
        lines.append(
            f"| `{v.name}` | {v.scope} | {required} | {cell(default)} | {cell(v.allowed)} "
            f"| {cell(v.description)} |"
        )
    return "\n".join(lines)


def flag_table() -> str:
    lines = ["| flag | set from | source | note |", "|---|---|---|---|"]
    for f in sglang_flags.FLAGS:
        names = ", ".join(f"`{n}`" for n in (f.name, *f.aliases))
        lines.append(f"| {names} | {cell(f.set_from)} | {f.source} | {cell(f.note)} |")
    return "\n".join(lines)


def cpu_flag_table() -> str:
    lines = ["| flag | value | note |", "|---|---|---|"]
    for f in sglang_flags.CPU_FLAGS:
        value = f"`{f.set_from}`" if f.set_from else "(a switch)"
        lines.append(f"| `{f.name}` | {value} | {cell(f.note)} |")
    return "\n".join(lines)


TABLES = {
    "contract-table": contract_table,
    "sglang-flag-table": flag_table,
    "cpu-flag-table": cpu_flag_table,
}


def section(name: str, text: str) -> re.Match[str]:
    match = re.search(
        rf"(<!-- {name}: generated.*?-->\n)(.*?)(\n<!-- /{name} -->)", text, re.DOTALL
    )
    assert match, f"docs/engine-launch.md lacks the {name} markers"
    return match


@pytest.mark.parametrize("name", list(TABLES))
def test_generated_tables_are_current(name: str) -> None:
    text = DOC.read_text()
    match = section(name, text)
    expected = TABLES[name]()
    if UPDATE and match.group(2) != expected:
        DOC.write_text(text[: match.start(2)] + expected + text[match.end(2) :])
        match = section(name, DOC.read_text())
    assert match.group(2) == expected, "stale table; see this module's docstring"


def test_every_derived_variable_is_documented() -> None:
    caches = {"TPUSERVE_WEIGHTS_CACHE_DIR": "/w", "TPUSERVE_COMPILE_CACHE_DIR": "/c"}
    env = caches | contract_env(
        "v6e",
        "4x4",
        hosts=4,
        chips_per_host=4,
        host_index=1,
        model="hf://o/m",
        worker_hostnames=("a", "b", "c", "d"),
    )
    names = set(launch.plan(LaunchContract.from_env(env)).env)
    cpu = caches | contract_env(model="hf://o/m")
    cpu |= {"TPUSERVE_DEVICE": "cpu", "TPUSERVE_CPU_KERNEL_SHIM_DIR": "/shim"}
    names |= set(launch.plan(LaunchContract.from_env(cpu)).env)
    for mode_env in launch.EAGER_MODE_ENV.values():
        names |= set(mode_env)
    text = DOC.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"undocumented derived variables: {missing}"
