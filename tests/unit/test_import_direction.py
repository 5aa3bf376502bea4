"""The import direction docs/architecture.md fixes: sglang_tpu depends on no other part, the
router and the operator never import each other nor the `tpuserve` command; and no module of
the four packages imports itself back through others (an import circle)."""

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


# ---------------------------------------------------------------- no import circle

ALL_PACKAGES = {**PACKAGES, "tpuserve": ROOT / "tpuserve"}


def module_files() -> dict[str, Path]:
    """Every module of the four packages by its dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package, root in ALL_PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which of the project's modules each module imports: every import, at module level, in
    a function or under ``TYPE_CHECKING`` alike (each ties the two modules' designs together;
    a deferred import only hides the circle from the interpreter). ``from package import
    name`` counts as the submodule when there is one; a module's own packages do not count
    (a package that imports its submodules is no circle)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for name in names:
                target = resolve(name)
                if target is not None and target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_the_circle_finder_finds_a_circle_through_a_deferred_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others() -> None:
    assert circles(import_graph(module_files())) == []


# ---------------------------------------------------------------- the router's package direction

ROUTER_NEVER_IMPORTS = {
    "pipeline": ("front",),
    "tenancy": ("front", "pipeline"),
    "peering": ("front", "pipeline", "tenancy"),
    "engines": ("front", "pipeline", "tenancy", "peering"),
    "kv": ("front", "pipeline", "tenancy", "policies"),
    "policies": ("front", "pipeline", "tenancy", "peering", "engines"),
}
"""docs/router.md, "Code": the router's sub-packages, each never importing those its reader
need not know (a front runs the pipeline, the pipeline never reaches back into a front; the
policies and the KV view know nothing of requests, tenants or fronts). No sub-package
imports the wiring (``app``, ``cli``, ``validation``)."""
WIRING = ("tpuserve_router.app", "tpuserve_router.cli", "tpuserve_router.validation")


def router_package(module: str) -> str | None:
    """The router sub-package of a module (None: a top-level module, or not the router's)."""
    parts = module.split(".")
    if parts[0] != "tpuserve_router" or len(parts) < 3:
        return None
    return parts[1]


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` against the router's package direction."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if (package := router_package(module)) is not None
        for target in targets
        if router_package(target) in ROUTER_NEVER_IMPORTS.get(package, ()) or target in WIRING
    )


def test_the_direction_check_finds_an_import_the_wrong_way() -> None:
    graph = {
        "tpuserve_router.kv.events": {"tpuserve_router.front.server", "tpuserve_router.metrics"},
        "tpuserve_router.front.server": {"tpuserve_router.pipeline.ledger"},
        "tpuserve_router.pipeline.ledger": {"tpuserve_router.app"},
        "tpuserve_router.app": {"tpuserve_router.front.server"},
    }
    assert wrong_way(graph) == [
        "tpuserve_router.kv.events imports tpuserve_router.front.server",
        "tpuserve_router.pipeline.ledger imports tpuserve_router.app",
    ]


def test_every_router_package_has_its_direction() -> None:
    packages = {
        p.name for p in PACKAGES["tpuserve_router"].iterdir() if (p / "__init__.py").exists()
    }
    assert packages == set(ROUTER_NEVER_IMPORTS) | {"front"}


def test_the_router_packages_import_in_one_direction() -> None:
    assert wrong_way(import_graph(module_files())) == []


# ---------------------------------------------------------------- config, the router's leaf

ROUTER_LEAF = PACKAGES["tpuserve_router"] / "config.py"
"""docs/router.md, "Code": the router's settings are the bottom of its graph. Every part may
read `tpuserve_router.config`; it reads none of them (each package makes its own settings
objects from a `RouterConfig` and checks its own part: `tpuserve_router.validation`)."""


def router_imports(source: str) -> list[str]:
    """The ``tpuserve_router`` modules a module directly in ``tpuserve_router`` imports: at
    module level, in a function or under ``TYPE_CHECKING`` alike; a relative import names
    one too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names = [f"tpuserve_router.{node.module or alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        found.update(n for n in names if n == "tpuserve_router" or n.startswith("tpuserve_router."))
    return sorted(found)


def test_the_leaf_check_finds_an_import_of_the_router() -> None:
    source = """
from typing import TYPE_CHECKING
from sglang_tpu.disaggregation import DEFAULT_ITL_BUDGET_SECONDS
from tpuserve_router.engines.outliers import OutlierConfig
if TYPE_CHECKING:
    from .policies import base
def later():
    import tpuserve_router.front.server
"""
    assert router_imports(source) == [
        "tpuserve_router.engines.outliers",
        "tpuserve_router.front.server",
        "tpuserve_router.policies",
    ]
    assert router_imports("import dataclasses\nfrom sglang_tpu import perf_model\n") == []


def test_config_imports_nothing_of_the_router() -> None:
    assert router_imports(ROUTER_LEAF.read_text(encoding="utf-8")) == []
