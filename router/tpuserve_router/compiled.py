"""Which of the router's modules run compiled (mypyc), and whether a checkout's build is fresh.

The request path's modules and the default policy are compiled to C with mypyc (docs/router.md,
"Compiled request path"); everything else, the other policies included, stays interpreted. A
wheel, and so the image, ships each compiled module beside its source, where Python's import
system prefers it. A checkout (an editable install) keeps them apart, in ``router/.compiled``
built by ``scripts/build_native.py``, and the package (and `policies`, `use_build`) puts that
folder first on its ``__path__`` only while the build matches the sources: after an edit the
router runs interpreted, with one warning, until the next build. This module is never
compiled itself.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

MODULES: Final = (
    "block_index",
    "cancellation",
    "connections",
    "core",
    "deadlines",
    "engine_loads",
    "forwarding",
    "hold",
    "kv_events",
    "load_view",
    "metrics",
    "policies.base",
    "policies.precise",
    "policies.prefix_routing",
    "proxy",
    "replies",
    "request_body",
    "server",
    "token_cache",
    "usage",
    "workers",
    "zmtp",
)
"""The modules compiled, by dotted name in the package: the request path from the socket to
the worker and back with the series it counts, the default policy (`precise`) and what it
builds on, and the KV events' path into the block index. The other policies stay
interpreted, subclassing the compiled bases."""

GROUP: Final = "tpuserve_router._compiled"
"""mypyc's group: its shared library is ``tpuserve_router/_compiled__mypyc.<suffix>``."""

PACKAGE: Final = Path(__file__).resolve().parent
BUILD_DIR: Final = PACKAGE.parent / ".compiled"
"""A checkout's build: ``tpuserve_router/`` with the extension modules, and the manifest."""
SOURCES: Final = (PACKAGE, PACKAGE.parents[1] / "sglang_tpu")
"""What a build is made from: the router's package and the modules of ``sglang_tpu`` that
compiled ones import (a checkout has both side by side)."""

MANIFEST: Final = "manifest.json"


def module_path(name: str, package: Path = PACKAGE) -> Path:
    """The source of the module called ``name`` in `MODULES` (``policies.base``: its file)."""
    return package.joinpath(*name.split(".")).with_suffix(".py")


def use_build(path: list[str], package: str) -> None:
    """Put the checkout's build of subpackage ``package`` (``tpuserve_router.policies``) first
    on its ``path``, if the top package runs its build (a subpackage's own ``__init__`` is
    found first, so it would not look there)."""
    top = sys.modules[__name__.rpartition(".")[0]]
    build = BUILD_DIR / "tpuserve_router"
    if str(build) in getattr(top, "__path__", ()):
        path.insert(0, str(build.joinpath(*package.split(".")[1:])))


def source_digest(sources: Sequence[Path] = SOURCES) -> str:
    """SHA-256 over every ``.py`` file under ``sources``, path and content.

    Every one counts, not only the compiled modules: mypyc reads the types (and inlines the
    ``Final`` constants) of every module they import.
    """
    digest = hashlib.sha256()
    for root in sources:
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}".encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def interpreter() -> str:
    """The interpreter a build is for: its version and its extension modules' suffix."""
    import sysconfig

    return f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}"


def stale_reason(build_dir: Path = BUILD_DIR, sources: Sequence[Path] = SOURCES) -> str | None:
    """Why the build in ``build_dir`` cannot stand for ``sources``, or None."""
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text())
    except FileNotFoundError:
        return "not built"
    except (OSError, ValueError) as err:
        return f"its manifest cannot be read ({err})"
    if not isinstance(manifest, dict):
        return "its manifest is not an object"
    if manifest.get("interpreter") != interpreter():
        return f"built for {manifest.get('interpreter')!r}, this is {interpreter()!r}"
    if manifest.get("sources") != source_digest(sources):
        return "the sources changed since the build"
    return None


def loaded() -> list[str]:
    """The compiled modules that are imported and running compiled."""
    return [
        name
        for name in MODULES
        if (module := sys.modules.get(f"{__package__}.{name}")) is not None
        and not str(getattr(module, "__file__", "")).endswith(".py")
    ]
