"""Rows of the contract table in docs/engine-launch.md, one per variable."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_tpu.contract.fields import allowed_values, env_name, render, scope
from sglang_tpu.contract.launch_contract import LaunchContract


@dataclass(frozen=True, slots=True)
class VariableDoc:
    """One row of the contract table in docs/engine-launch.md."""

    name: str
    scope: str
    required: bool
    default: str
    allowed: str
    description: str


def variables() -> list[VariableDoc]:
    """Every contract variable, in definition order, for docs and tests."""
    rows = []
    for field in LaunchContract.model_fields.values():
        required = field.is_required()
        default = "" if required or field.default is None else render(field.default)
        rows.append(
            VariableDoc(
                name=env_name(field),
                scope=scope(field),
                required=required,
                default=default,
                allowed=allowed_values(field),
                description=field.description or "",
            )
        )
    return rows
