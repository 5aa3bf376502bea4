"""The `bench/` programs as modules, for tests of their pure parts (they are scripts, not a
package: each is loaded from its file)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str, module_name: str | None = None) -> ModuleType:
    """``bench/<name>.py`` loaded as module ``module_name`` (default: ``name``), registered in
    `sys.modules` first: dataclasses look their module up while the class is built."""
    spec = importlib.util.spec_from_file_location(module_name or name, BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
