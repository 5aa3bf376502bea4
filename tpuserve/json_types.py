"""The name of a decoded JSON (or YAML) value's JSON type, as docs and test reports print it."""

from __future__ import annotations

from typing import Any


def json_type(value: Any) -> str:
    """The type name of `value`; TypeError for a value JSON cannot hold."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r:.80}")
