"""The package's public surface is exactly what its docstring promises."""

from __future__ import annotations

import pytest

import tpuserve_operator

pytestmark = pytest.mark.unit


def test_public_names() -> None:
    assert sorted(tpuserve_operator.__all__) == [
        "InvalidSpec",
        "Problem",
        "RenderConfig",
        "TPUModelServerSpec",
        "build_children",
        "custom_resource_definition",
        "validate",
    ]
    for name in tpuserve_operator.__all__:
        assert getattr(tpuserve_operator, name) is not None
