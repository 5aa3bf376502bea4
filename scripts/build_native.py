"""Build the router's compiled parts: the block index (router/native, Rust) into
router/tpuserve_router/_native.abi3.so, and the request path (mypyc) into router/.compiled.

Run by the wheel's build hook (hatch_build.py) and by scripts/venv.sh on every call, so an
editable checkout picks up a change to the sources; cargo rebuilds only what changed (well under
a second when nothing did), and mypyc runs only when a router source changed since its build
(router/.compiled/manifest.json; about a minute when it runs). Needs Rust's cargo (1.85 or
newer, rustup.rs), a C compiler and linker, and mypy and setuptools in the interpreter built
for; the crates come from crates.io at the versions in router/native/Cargo.lock.

    python scripts/build_native.py [--python PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CRATE = ROOT / "router" / "native"
LIBRARY = "libtpuserve_router_native"
EXTENSION = ROOT / "router" / "tpuserve_router" / "_native.abi3.so"


def _load_compiled() -> ModuleType:
    """tpuserve_router/compiled.py alone (the list of modules and the manifest's checks),
    without the package, whose import would judge the very build being made."""
    spec = importlib.util.spec_from_file_location(
        "tpuserve_router_compiled", ROOT / "router" / "tpuserve_router" / "compiled.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compiled = _load_compiled()


def find_cargo() -> str:
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    if not Path(cargo).is_file():
        raise SystemExit(
            "building tpuserve's router needs Rust's cargo (1.85 or newer) and a C linker "
            "(cc): install Rust with rustup (https://rustup.rs), then rerun"
        )
    return cargo


def build(python: str = sys.executable) -> Path:
    """Build the extension for ``python`` and copy it next to the router's modules."""
    env = {**os.environ, "PYO3_PYTHON": python}
    env.pop("CARGO_BUILD_TARGET", None)  # the library must be for this machine, where we look
    target = Path(env.get("CARGO_TARGET_DIR") or CRATE / "target")
    command = [
        find_cargo(), "build", "--release", "--locked", "--quiet",
        "--features", "extension-module", "--manifest-path", str(CRATE / "Cargo.toml"),
        "--target-dir", str(target),
    ]  # fmt: skip
    subprocess.run(command, check=True, env=env)
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    built = (target / "release" / f"{LIBRARY}{suffix}").read_bytes()
    if not EXTENSION.exists() or EXTENSION.read_bytes() != built:
        # A new file renamed into place: a process that has the old one loaded keeps it.
        with tempfile.NamedTemporaryFile(dir=EXTENSION.parent, delete=False) as tmp:
            tmp.write(built)
        try:
            os.chmod(tmp.name, 0o644)  # the image runs as another user than the one building
            os.replace(tmp.name, EXTENSION)
        finally:
            Path(tmp.name).unlink(missing_ok=True)
    return EXTENSION


def compile_request_path(python: str = sys.executable, out: Path = compiled.BUILD_DIR) -> Path:
    """Compile `compiled.MODULES` with mypyc for ``python`` into ``out``/tpuserve_router.

    Skipped when ``out``'s manifest matches the sources, the interpreter and mypy's version.
    The build runs in ``python`` itself (mypyc builds for the interpreter running it).
    """
    command = [python, __file__, "--compile-into", str(out)]
    subprocess.run(command, check=True)
    return out / "tpuserve_router"


def missing_dependencies() -> list[str]:
    """The project's dependencies (pyproject.toml) not installed in this interpreter."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        requirements = tomllib.load(file)["project"]["dependencies"]
    missing = []
    for requirement in requirements:
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _compile_here(out: Path) -> None:
    """`compile_request_path`'s work, in the interpreter the modules are for."""
    import mypy.version
    from mypyc.build import mypycify
    from setuptools import Distribution

    package = ROOT / "router" / "tpuserve_router"
    manifest = {
        "interpreter": compiled.interpreter(),
        "mypy": mypy.version.__version__,
        "sources": compiled.source_digest(),
    }
    try:
        if json.loads((out / compiled.MANIFEST).read_text()) == manifest:
            return
    except (OSError, ValueError):
        pass
    if missing := missing_dependencies():
        raise SystemExit(
            "compiling the router's request path (mypyc) type-checks it against its "
            f"dependencies, and {', '.join(missing)} cannot be found: install them where the "
            "wheel is built and build without isolation (pip wheel --no-build-isolation, as "
            "the Dockerfile does)"
        )
    with tempfile.TemporaryDirectory(prefix="tpuserve-mypyc-") as work:
        built = Path(work) / "lib"
        # mypy reads its configuration (pyproject.toml: strict, mypy_path) from the root.
        os.chdir(ROOT)
        extensions = mypycify(
            [str(compiled.module_path(name, package)) for name in compiled.MODULES],
            opt_level="3",
            group_name=compiled.GROUP,
            target_dir=str(Path(work) / "c"),
        )
        distribution = Distribution({"name": "tpuserve-router-compiled", "ext_modules": extensions})
        command = distribution.get_command_obj("build_ext")
        command.build_lib = str(built)  # type: ignore[attr-defined]
        command.build_temp = str(Path(work) / "temp")  # type: ignore[attr-defined]
        command.parallel = os.cpu_count() or 1  # type: ignore[attr-defined]
        distribution.run_command("build_ext")
        # Replace the build whole: the manifest last, so a failed copy leaves no manifest.
        (out / compiled.MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(out / "tpuserve_router", ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built / "tpuserve_router", out / "tpuserve_router")
        (out / compiled.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to build for")
    parser.add_argument("--compile-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_into is not None:
        _compile_here(args.compile_into)
        return 0
    print(build(args.python))
    print(compile_request_path(args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
