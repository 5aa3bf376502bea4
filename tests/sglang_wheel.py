"""SGLang's own definitions, read from the pinned wheel at test time (never copied into the repo).

The pin is the `sglang==X` requirement of pyproject's `tpu` extra. The wheel is fetched once with
pip (`--no-deps`, PyPI only) into `$TPUSERVE_CACHE/sglang/wheels/` and unpacked beside it; later
runs reuse the unpacked tree. Tests read source files from it (for example with `ast`) or load a
self-contained module from it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIP_TIMEOUT_SECONDS = 600


def pinned_version() -> str:
    """The SGLang version pinned by pyproject's `tpu` extra (the one source of the pin)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirement: str
    for requirement in project["optional-dependencies"]["tpu"]:
        name, sep, version = requirement.partition("==")
        if name.strip() == "sglang" and sep:
            return version.strip()
    raise LookupError("pyproject's tpu extra pins no sglang==X")


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpuserve"
    return Path(os.environ.get("TPUSERVE_CACHE", default))


def unpacked_wheel(version: str | None = None) -> Path:
    """The directory holding the unpacked `sglang` package of the pinned wheel (fetched once)."""
    version = version or pinned_version()
    root = cache_root() / "sglang" / "wheels"
    target = root / f"sglang-{version}"
    done = target / ".unpacked"
    if done.exists():
        return target / "sglang"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers fetch it once
        if not done.exists():
            wheels = list(root.glob(f"sglang-{version}-*.whl"))
            if not wheels:
                subprocess.run(
                    [
                        *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                        *("--only-binary=:all:", f"sglang=={version}", "-d", str(root)),
                    ],
                    check=True,
                    timeout=PIP_TIMEOUT_SECONDS,
                )
                wheels = list(root.glob(f"sglang-{version}-*.whl"))
            (wheel,) = wheels
            with zipfile.ZipFile(wheel) as archive:
                members = [m for m in archive.namelist() if m.startswith("sglang/")]
                archive.extractall(target, members)
            done.touch()
    return target / "sglang"


def source(relative: str, version: str | None = None) -> Path:
    """A file inside the pinned `sglang` package, e.g. `srt/disaggregation/kv_events.py`."""
    path = unpacked_wheel(version) / relative
    if not path.is_file():
        raise FileNotFoundError(f"sglang {version or pinned_version()} has no {relative}")
    return path
