"""The compiled request path: which build the package runs, and when a checkout's is stale."""

from __future__ import annotations

import ast
import importlib
import json
import shutil
from pathlib import Path

import pytest

import tpuserve_router
from tpuserve_router import compiled

pytestmark = pytest.mark.unit


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the package's sources, and a build of it that is fresh."""
    copy = tmp_path / "tpuserve_router"
    shutil.copytree(compiled.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    build = tmp_path / ".compiled"
    build.mkdir()
    manifest = {"interpreter": compiled.interpreter(), "sources": compiled.source_digest([copy])}
    (build / compiled.MANIFEST).write_text(json.dumps(manifest))
    return copy


def test_a_build_of_the_same_sources_for_this_interpreter_is_fresh(package: Path) -> None:
    assert compiled.stale_reason(package.parent / ".compiled", [package]) is None


def test_an_edit_to_any_source_makes_the_build_stale(package: Path) -> None:
    """Not only the compiled modules: mypyc reads the types of the modules they import."""
    config = package / "config.py"
    assert "config" not in compiled.MODULES
    config.write_text(config.read_text() + "\n# edited\n")
    reason = compiled.stale_reason(package.parent / ".compiled", [package])
    assert reason == "the sources changed since the build"


def test_a_new_source_file_makes_the_build_stale(package: Path) -> None:
    (package / "policies" / "new_policy.py").write_text("")
    assert compiled.stale_reason(package.parent / ".compiled", [package]) is not None


def test_a_build_for_another_interpreter_is_stale(package: Path) -> None:
    manifest_path = package.parent / ".compiled" / compiled.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["interpreter"] = "cpython-312 .cpython-312-x86_64-linux-gnu.so"
    manifest_path.write_text(json.dumps(manifest))
    reason = compiled.stale_reason(package.parent / ".compiled", [package])
    assert reason is not None
    assert reason.startswith("built for 'cpython-312")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "not built"),
        ("{not json", "its manifest cannot be read"),
        ("[]", "its manifest is not an object"),
    ],
)
def test_a_missing_or_broken_manifest_is_stale(
    package: Path, content: str | None, reason: str
) -> None:
    manifest_path = package.parent / ".compiled" / compiled.MANIFEST
    manifest_path.unlink()
    if content is not None:
        manifest_path.write_text(content)
    found = compiled.stale_reason(package.parent / ".compiled", [package])
    assert found is not None
    assert found.startswith(reason)


def test_every_compiled_module_is_a_module_of_the_package() -> None:
    assert sorted(compiled.MODULES) == list(compiled.MODULES)
    assert [m for m in compiled.MODULES if not compiled.module_path(m).is_file()] == []


def test_the_package_runs_the_checkouts_build_exactly_when_it_is_fresh() -> None:
    """A fresh build of the checkout (scripts/venv.sh makes one) is what every module of
    `MODULES` runs; a stale or missing one leaves all of them interpreted."""
    for name in compiled.MODULES:
        importlib.import_module(f"tpuserve_router.{name}")
    fresh = compiled.BUILD_DIR.is_dir() and compiled.stale_reason() is None
    build = str(compiled.BUILD_DIR / "tpuserve_router")
    assert (build in tpuserve_router.__path__) == fresh
    assert compiled.loaded() == (list(compiled.MODULES) if fresh else [])


def test_the_build_is_made_from_the_router_and_sglang_tpu(tmp_path: Path) -> None:
    """Compiled modules import sglang_tpu's (the tokenizer, the KV-event structs): an edit
    there changes the digest too."""
    assert [root.name for root in compiled.SOURCES] == ["tpuserve_router", "sglang_tpu"]
    other = tmp_path / "sglang_tpu"
    other.mkdir()
    (other / "tokenizer.py").write_text("A = 1\n")
    before = compiled.source_digest([compiled.PACKAGE, other])
    (other / "tokenizer.py").write_text("A = 2\n")
    assert compiled.source_digest([compiled.PACKAGE, other]) != before


def test_no_compiled_function_binds_one_exception_name_to_two_types() -> None:
    """mypyc gives a name one type per function: `except A as err` then `except B as err`
    makes the second a TypeError at run time (B is not A), inside the router's own error
    handling. Each handler of another type takes another name."""
    found = []
    for name in compiled.MODULES:
        tree = ast.parse(compiled.module_path(name).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            bound: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type:
                    bound.setdefault(node.name, set()).add(ast.unparse(node.type))
            found += [
                f"{name}.{function.name}: {var} {sorted(types)}"
                for var, types in bound.items()
                if len(types) > 1
            ]
    assert found == []
