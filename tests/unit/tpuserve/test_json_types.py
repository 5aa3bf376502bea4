"""`json_type` names every JSON type (a bool is not an int) and refuses anything else."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve.json_types import json_type

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("value", "name"),
    [(None, "null"), (True, "bool"), (3, "int"), (0.5, "float"), ("x", "string"),
     ([], "list"), ({}, "object")],
)  # fmt: skip
def test_every_json_value_has_its_type_name(value: Any, name: str) -> None:
    assert json_type(value) == name


def test_a_value_json_cannot_hold_is_refused() -> None:
    with pytest.raises(TypeError, match="not a JSON value: b'x'"):
        json_type(b"x")
