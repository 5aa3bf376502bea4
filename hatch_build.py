"""Wheel build hook: compile the router's native block index (scripts/build_native.py) and
ship it in the wheel, which is then specific to the platform."""

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
