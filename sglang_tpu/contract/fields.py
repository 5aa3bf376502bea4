"""Field building blocks of the launch contract: value types, the variable binding, checks."""

from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sglang_tpu.contract.env_names import Var

PORTS_ALLOWED = "an integer from 1 to 65535"
ABSOLUTE_PATH = "an absolute path"

DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def _split_args(value: object) -> object:
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as err:  # unbalanced quotes
            raise ValueError(f"not a shell-quoted argument list ({err})") from None
    return value


Port = Annotated[int, Field(ge=1, le=65535)]
Index = Annotated[int, Field(ge=0, le=100_000)]
CommaList = Annotated[tuple[str, ...], BeforeValidator(_split_list)]
HostnameList = CommaList
ArgList = Annotated[tuple[str, ...], BeforeValidator(_split_args)]


def var(
    name: Var,
    allowed: str,
    doc: str,
    *,
    default: Any = PydanticUndefined,
    scope: Literal["group", "pod"] = "group",
    **constraints: Any,
) -> Any:
    """A field bound to its environment variable (name, allowed values, description)."""
    return Field(
        default,
        validation_alias=name.value,
        description=doc,
        json_schema_extra={"env": name.value, "allowed": allowed, "scope": scope},
        **constraints,
    )


def env_name(field: FieldInfo) -> str:
    """The environment variable a field made by `var` reads."""
    alias = field.validation_alias
    assert isinstance(alias, str)
    return alias


def allowed_values(field: FieldInfo) -> str:
    """What a field made by `var` allows, as its problems and the docs say it."""
    return str(_extra(field)["allowed"])


def scope(field: FieldInfo) -> str:
    """`group` (the same on every pod of the group) or `pod`."""
    return str(_extra(field)["scope"])


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    assert isinstance(extra, dict)
    return extra


def render(value: object, *, shell: bool = False) -> str:
    """A field value as its environment variable spells it."""
    if isinstance(value, tuple):
        return shlex.join(value) if shell else ",".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def check_absolute(value: str | None) -> str | None:
    if value is not None and (not value.startswith("/") or "/../" in f"{value}/"):
        raise ValueError("not an absolute path")
    return value
