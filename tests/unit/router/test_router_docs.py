"""docs/router.md stays true to the code: every flag, policy, parameter and series is there."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tpuserve_router.cli import configure
from tpuserve_router.metrics import StateCollector, create_router_metrics
from tpuserve_router.policies import make_policy, registered_policy_names

pytestmark = pytest.mark.unit

DOC = (Path(__file__).resolve().parents[3] / "docs" / "router.md").read_text()


def test_every_flag_is_documented() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    missing = [f for f in flags if f"`{f}" not in DOC and f != "--help"]
    assert not missing


def test_every_policy_and_parameter_is_documented() -> None:
    for name in registered_policy_names():
        assert f"`{name}`" in DOC
        params = getattr(make_policy(name), "params", None)
        for field in dataclasses.fields(params) if params is not None else ():
            assert f"`{field.name}`" in DOC, (name, field.name)


def test_every_series_is_documented() -> None:
    registry = CollectorRegistry()
    create_router_metrics(registry)
    registry.register(StateCollector(lambda: [], dict))
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        short = "_" + name.removeprefix("tpuserve_router_")
        assert f"`{name}`" in DOC or f"`{short}`" in DOC, name


def test_every_module_is_on_the_code_map() -> None:
    """Every module by its path in the package (``front/server.py``), every sub-package's
    heading (``front/``); a folder inside a sub-package (``engines/discovery/``) by its path."""
    package = Path(__file__).resolve().parents[3] / "router" / "tpuserve_router"
    names = [f"`{p.name}`" for p in package.glob("*.py") if p.name != "__init__.py"]
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
        names.append(f"`{sub.name}/`")
        if sub.name == "policies":  # one module per policy: the package's row names them
            continue
        for path in sorted(sub.rglob("*.py")):
            relative = path.relative_to(package).as_posix()
            if path.name == "__init__.py":
                relative = relative.removesuffix("__init__.py")
                if relative == f"{sub.name}/":
                    continue
            elif path.parent != sub:  # inside a folder of the sub-package: the folder's row
                continue
            names.append(f"`{relative}`")
    assert [n for n in names if n not in DOC] == []
