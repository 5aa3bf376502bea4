"""The compiled request path as a checkout and a wheel hold it (tpuserve_router.compiled)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpuserve_router import compiled

pytestmark = pytest.mark.component


def run_python(code: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter with ``path`` first on its import path."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def test_a_stale_build_is_not_used_and_says_so(tmp_path: Path) -> None:
    """In a copy of the checkout's router whose build is stale: interpreted, with a warning."""
    router = tmp_path / "router"
    shutil.copytree(
        compiled.PACKAGE, router / "tpuserve_router",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    build = router / ".compiled" / "tpuserve_router"
    build.mkdir(parents=True)
    (router / ".compiled" / compiled.MANIFEST).write_text(
        json.dumps({"interpreter": compiled.interpreter(), "sources": "0" * 64})
    )
    probe = (
        "import tpuserve_router, tpuserve_router.server as s; "
        "print(s.__file__); print(tpuserve_router.__path__)"
    )
    done = run_python(probe, router)
    assert done.stdout.splitlines() == [
        str(router / "tpuserve_router" / "server.py"),
        str([str(router / "tpuserve_router")]),
    ]
    assert "the router runs interpreted" in done.stderr
    assert "the sources changed since the build" in done.stderr


def test_the_wheel_ships_the_compiled_request_path_beside_its_sources(tmp_path: Path) -> None:
    """Built as the image builds it (no isolation, scripts/build_native.py through the hook),
    the wheel holds every compiled module beside its source, and imported from the wheel's
    files each of them runs compiled: the import system prefers an extension module."""
    root = compiled.PACKAGE.parents[1]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(root)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheels").glob("tpuserve-*.whl")
    assert f"-cp3{sys.version_info.minor}-" in wheel.name  # for this interpreter only
    unpacked = tmp_path / "site"
    shutil.unpack_archive(wheel, unpacked, format="zip")
    package = unpacked / "tpuserve_router"
    suffix = compiled.interpreter().split()[1]
    for name in (*compiled.MODULES, "_compiled__mypyc"):
        assert compiled.module_path(name, package).with_suffix(suffix).is_file(), name
    for name in compiled.MODULES:
        assert compiled.module_path(name, package).is_file(), name
    probe = (
        "import importlib, tpuserve_router, tpuserve_router.compiled as c\n"
        "for name in c.MODULES: importlib.import_module('tpuserve_router.' + name)\n"
        "print(c.loaded() == list(c.MODULES), tpuserve_router.__path__)"
    )
    done = run_python(probe, unpacked)
    assert done.stdout.strip() == f"True {[str(package)]}"
    assert done.stderr == ""
