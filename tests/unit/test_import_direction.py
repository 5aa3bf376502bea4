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


# ---------------------------------------------------------------- the router's layers

ROUTER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("config", "labels", "series"),
    ("config_checks",),
    ("metrics",),
    ("kv",),
    ("policies",),
    ("engines",),
    ("peering",),
    ("core",),
    ("tenancy",),
    ("pipeline",),
    ("front",),
    ("validation",),
    ("options",),
    ("app",),
    ("cli",),
)
"""docs/router.md, "Code": the router's parts (a sub-package, or a module at the top), bottom
first. A module reaches, through any chain of imports, only modules of its own part or of the
parts below it: the settings, the label vocabularies and the series kinds at the bottom,
importing nothing of the router; the checks of the settings' values; the series; the KV view,
which knows no request; the policies (they read the block index); the engines (registry, health,
admission, connections); the replicas' peering; the shared core; tenancy; the request pipeline;
the fronts; the wiring (the settings' checks, the flags, the app, the command). No two parts
import each other, directly or through others."""


def router_part(module: str) -> str | None:
    """The router part of a module (its sub-package, or the top-level module itself); None:
    not the router's, or the package itself."""
    parts = module.split(".")
    if parts[0] != "tpuserve_router" or len(parts) < 2:
        return None
    return parts[1]


def layer_violations(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each router module that reaches, through any chain of imports of ``graph``, a module of
    a part above its own (or of another part of its own layer), with the chain; and each part
    ``layers`` does not place."""
    rank = {part: i for i, layer in enumerate(layers) for part in layer}
    found: set[str] = set()
    for module in sorted(graph):
        own = router_part(module)
        if own is None:
            continue
        if own not in rank:
            found.add(f"{module}: its part {own!r} is on no layer")
            continue
        # breadth first: the shortest chain to each module it reaches
        chains = {module: [module]}
        frontier = [module]
        while frontier:
            following: list[str] = []
            for current in frontier:
                for target in sorted(graph.get(current, ())):
                    if target in chains:
                        continue
                    chains[target] = [*chains[current], target]
                    following.append(target)
            frontier = following
        for target, chain in chains.items():
            part = router_part(target)
            if part is None or part == own or part not in rank:
                continue
            if rank[part] >= rank[own]:
                found.add(f"{module} reaches {target}: " + " -> ".join(chain))
    return sorted(found)


def test_the_layer_check_finds_an_indirect_import_up_the_layers() -> None:
    # kv -> metrics is allowed; metrics -> pipeline is not: kv reaches the pipeline through it
    graph = {
        "tpuserve_router.kv.events": {"tpuserve_router.metrics"},
        "tpuserve_router.metrics": {"tpuserve_router.labels", "tpuserve_router.pipeline.ledger"},
        "tpuserve_router.pipeline.ledger": {"tpuserve_router.config"},
        "tpuserve_router.labels": set(),
        "tpuserve_router.config": set(),
    }
    assert layer_violations(graph, ROUTER_LAYERS) == [
        "tpuserve_router.kv.events reaches tpuserve_router.pipeline.ledger: "
        "tpuserve_router.kv.events -> tpuserve_router.metrics -> tpuserve_router.pipeline.ledger",
        "tpuserve_router.metrics reaches tpuserve_router.pipeline.ledger: "
        "tpuserve_router.metrics -> tpuserve_router.pipeline.ledger",
    ]
    # the same chain through a module of no part of the router (sglang_tpu, say) is found too
    through = {
        "tpuserve_router.kv.events": {"sglang_tpu.helper"},
        "sglang_tpu.helper": {"tpuserve_router.front.server"},
        "tpuserve_router.front.server": set(),
    }
    assert layer_violations(through, ROUTER_LAYERS) == [
        "tpuserve_router.kv.events reaches tpuserve_router.front.server: "
        "tpuserve_router.kv.events -> sglang_tpu.helper -> tpuserve_router.front.server"
    ]
    # two parts importing each other (engines <-> kv): the lower one reaches up
    mutual = {
        "tpuserve_router.engines.admission": {"tpuserve_router.kv.events"},
        "tpuserve_router.kv.events": {"tpuserve_router.engines.workers"},
        "tpuserve_router.engines.workers": set(),
    }
    assert layer_violations(mutual, ROUTER_LAYERS) == [
        "tpuserve_router.kv.events reaches tpuserve_router.engines.workers: "
        "tpuserve_router.kv.events -> tpuserve_router.engines.workers"
    ]


def test_every_router_part_is_on_one_layer() -> None:
    root = PACKAGES["tpuserve_router"]
    parts = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    parts |= {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    placed = [part for layer in ROUTER_LAYERS for part in layer]
    assert sorted(placed) == sorted(set(placed)), "a part on two layers"
    assert parts == set(placed)


def test_the_router_imports_down_its_layers_only() -> None:
    assert layer_violations(import_graph(module_files()), ROUTER_LAYERS) == []


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
