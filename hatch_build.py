"""Wheel build hook: compile the router's native block index and its request path
(scripts/build_native.py) and ship them in the wheel, which is then specific to the platform
and the Python version. An editable install gets neither here: scripts/venv.sh builds them
in the checkout."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeExtensionHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        build_native = runpy.run_path(str(Path(self.root) / "scripts" / "build_native.py"))
        extension = build_native["build"]()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][str(extension)] = "tpuserve_router/_native.abi3.so"
            # Beside their sources, where the import system prefers them (tpuserve_router.compiled);
            # router/.compiled is reused when its manifest says it is this build.
            compiled = build_native["compile_request_path"]()
            for module in compiled.rglob("*"):
                if module.is_file():
                    name = module.relative_to(compiled).as_posix()
                    build_data["force_include"][str(module)] = f"tpuserve_router/{name}"
