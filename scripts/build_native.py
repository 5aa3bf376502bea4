"""Build the router's compiled block index (router/native, Rust) into
router/tpuserve_router/_native.abi3.so.

Run by the wheel's build hook (hatch_build.py) and by scripts/venv.sh on every call, so an
editable checkout picks up a change to the Rust sources; cargo rebuilds only what changed
(well under a second when nothing did). Needs Rust's cargo (1.85 or newer, rustup.rs) and a
C linker; the crates come from crates.io at the versions in router/native/Cargo.lock.

    python scripts/build_native.py [--python PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATE = ROOT / "router" / "native"
LIBRARY = "libtpuserve_router_native"
EXTENSION = ROOT / "router" / "tpuserve_router" / "_native.abi3.so"


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to build for")
    args = parser.parse_args()
    print(build(args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
