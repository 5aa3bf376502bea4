"""The import direction ARCHITECTURE.md fixes: sglang_tpu depends on no other part, the router
and the operator never import each other nor the `tpuserve` command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "sglang_tpu": ROOT / "sglang_tpu",
    "tpuserve_router": ROOT / "router" / "tpuserve_router",
    "tpuserve_operator": ROOT / "operator" / "tpuserve_operator",
}
FORBIDDEN = {
    "sglang_tpu": ("tpuserve", "tpuserve_router", "tpuserve_operator"),
    "tpuserve_router": ("tpuserve", "tpuserve_operator"),
    "tpuserve_operator": ("tpuserve", "tpuserve_router"),
}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_follow_the_fixed_direction(package: str) -> None:
    root = PACKAGES[package]
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m
            for m in imported_modules(path)
            if any(m == f or m.startswith(f"{f}.") for f in FORBIDDEN[package])
        )
        for path in sorted(root.rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
