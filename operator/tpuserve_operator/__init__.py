"""The kopf operator that turns TPUModelServer resources into model servers on GKE TPU pools.

The public surface (pinned by tests/unit/operator/test_exported_members.py):

- `build_children(meta, spec, config)`: every child manifest of a server, validated;
- `validate(name, spec)`: the typed spec or `InvalidSpec` naming every `Problem` of the spec
  itself (`build_children` adds the launch contract, which needs the server's identity);
- `RenderConfig`: operator settings and cluster capabilities that shape the children;
- `custom_resource_definition()`: the CRD, generated from the API models;
- `TPUModelServerSpec`: the spec's pydantic model (the one schema source).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuserve_operator.api import TPUModelServerSpec
    from tpuserve_operator.build.crd import custom_resource_definition
    from tpuserve_operator.errors import InvalidSpec, Problem
    from tpuserve_operator.render import RenderConfig, build_children
    from tpuserve_operator.validation import validate

_SURFACE = {
    "InvalidSpec": "tpuserve_operator.errors",
    "Problem": "tpuserve_operator.errors",
    "RenderConfig": "tpuserve_operator.render",
    "TPUModelServerSpec": "tpuserve_operator.api",
    "build_children": "tpuserve_operator.render",
    "custom_resource_definition": "tpuserve_operator.build.crd",
    "validate": "tpuserve_operator.validation",
}
"""Loaded on first use (PEP 562): importing one light submodule (`scaling_behavior`, which the
fleet model and `tpuserve plan --fit` use) does not load the API models, the CEL evaluator and
the Kubernetes client (~1.5 s of CPU)."""


def __getattr__(name: str) -> Any:
    module = _SURFACE.get(name)
    if module is None:
        raise AttributeError(f"module 'tpuserve_operator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "InvalidSpec",
    "Problem",
    "RenderConfig",
    "TPUModelServerSpec",
    "build_children",
    "custom_resource_definition",
    "validate",
]
