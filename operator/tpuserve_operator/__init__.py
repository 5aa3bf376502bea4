"""The kopf operator that turns TPUModelServer resources into model servers on GKE TPU pools.

The public surface (pinned by tests/unit/operator/test_exported_members.py):

- `build_children(meta, spec, config)`: every child manifest of a server, validated;
- `validate(name, spec)`: the typed spec or `InvalidSpec` naming every `Problem` of the spec
  itself (`build_children` adds the launch contract, which needs the server's identity);
- `RenderConfig`: operator settings and cluster capabilities that shape the children;
- `custom_resource_definition()`: the CRD, generated from the API models;
- `TPUModelServerSpec`: the spec's pydantic model (the one schema source).
"""

from tpuserve_operator.api import TPUModelServerSpec
from tpuserve_operator.build.crd import custom_resource_definition
from tpuserve_operator.errors import InvalidSpec, Problem
from tpuserve_operator.render import RenderConfig, build_children
from tpuserve_operator.validation import validate

__all__ = [
    "InvalidSpec",
    "Problem",
    "RenderConfig",
    "TPUModelServerSpec",
    "build_children",
    "custom_resource_definition",
    "validate",
]
