"""`tpuserve_operator.api` exports every public name the schema's parts define, and no other."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import pytest

from tpuserve_operator import api, schema

pytestmark = pytest.mark.unit


def _defined_names(module_name: str) -> set[str]:
    """Public names a module defines at its top level (classes, functions, assignments)."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def _parts() -> dict[str, set[str]]:
    return {
        info.name: _defined_names(f"{schema.__name__}.{info.name}")
        for info in pkgutil.iter_modules(schema.__path__)
    }


def test_every_public_name_of_a_part_is_exported_by_api_as_the_same_object() -> None:
    parts = _parts()
    assert {"server", "status"} <= parts.keys()  # the walk found the package's modules
    for part, names in parts.items():
        module = importlib.import_module(f"{schema.__name__}.{part}")
        for name in names:
            assert name in api.__all__, f"schema.{part}.{name} is not exported by api"
            assert getattr(api, name) is getattr(module, name), f"api.{name} is another object"


def test_api_exports_nothing_the_parts_do_not_define() -> None:
    defined = set().union(*_parts().values())
    assert set(api.__all__) - defined == set()
    assert len(api.__all__) == len(set(api.__all__))


def test_no_two_parts_define_the_same_name() -> None:
    seen: dict[str, str] = {}
    for part, names in _parts().items():
        for name in names:
            assert name not in seen, f"{name} is defined in schema.{seen[name]} and {part}"
            seen[name] = part
