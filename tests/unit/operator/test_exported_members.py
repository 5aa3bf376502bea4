"""The package's public surface is exactly what its docstring promises."""

from __future__ import annotations

import re

import pytest

import tpuserve_operator

pytestmark = pytest.mark.unit


def test_public_names_are_the_ones_the_docstring_names() -> None:
    assert tpuserve_operator.__doc__ is not None
    promised = set(re.findall(r"`(\w+)", tpuserve_operator.__doc__))
    assert sorted(tpuserve_operator.__all__) == sorted(promised)
    for name in tpuserve_operator.__all__:
        assert getattr(tpuserve_operator, name) is not None
