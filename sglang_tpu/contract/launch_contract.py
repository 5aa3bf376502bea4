"""LaunchContract: one pod's whole contract, read back from its environment by the launcher."""

from __future__ import annotations

import difflib
import ipaddress
import logging
from collections.abc import Mapping
from typing import Any, Self

from pydantic import ValidationError, ValidationInfo, field_validator

from sglang_tpu.contract.env_names import ENV_PREFIX, Var
from sglang_tpu.contract.fields import DNS_NAME, Index, allowed_values, env_name, var
from sglang_tpu.contract.group_contract import GroupContract
from sglang_tpu.contract.problems import ContractError, Problem

log = logging.getLogger(__name__)


class LaunchContract(GroupContract):
    """The whole contract of one pod: the group's values plus this pod's host index."""

    host_index: Index = var(
        Var.HOST_INDEX,
        "an integer from 0 to hosts - 1",
        "This pod's host in the slice (NODE_RANK, TPU_WORKER_ID); 0 is the leader.",
        scope="pod",
    )
    pod_name: str | None = var(
        Var.POD_NAME, "a DNS subdomain name", "This pod's name (logs).", scope="pod", default=None
    )
    pod_ip: str | None = var(
        Var.POD_IP, "an IP address", "This pod's IP (logs).", scope="pod", default=None
    )

    @field_validator("pod_name")
    @classmethod
    def _pod_name(cls, value: str | None) -> str | None:
        if value is not None and not DNS_NAME.match(value):
            raise ValueError("not a DNS subdomain name")
        return value

    @field_validator("pod_ip")
    @classmethod
    def _pod_ip(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError("not an IP address") from None
        return value

    @field_validator("host_index")
    @classmethod
    def _host_index(cls, value: int, info: ValidationInfo) -> int:
        hosts = info.data.get("hosts")
        if hosts is not None and value >= hosts:
            raise ValueError(f"the slice has {hosts} hosts (0 to {hosts - 1})")
        return value

    @property
    def is_leader(self) -> bool:
        return self.host_index == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """Read the contract from the environment; ContractError lists every problem."""
        known = {env_name(f): f for f in cls.model_fields.values()}
        problems: list[Problem] = []
        raw: dict[str, str] = {}
        for name, value in env.items():
            if not name.startswith(ENV_PREFIX):
                continue
            field = known.get(name)
            if field is None:
                close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
                if close:
                    problems.append(
                        Problem(name, value, f"unknown variable; did you mean {close[0]}", close[0])
                    )
                else:
                    log.warning("%s is not a launch contract variable; ignored", name)
            elif value == "":
                problems.append(
                    Problem(
                        name,
                        value,
                        "empty (an empty variable counts as set); unset it or give a value",
                        allowed_values(field),
                    )
                )
            else:
                raw[name] = value
        try:
            contract = cls.model_validate(raw)
        except ValidationError as err:
            problems += [_problem(cls, e, raw) for e in err.errors()]
            raise ContractError(_dedupe(problems)) from None
        if problems:
            raise ContractError(problems)
        return contract


def _problem(cls: type[GroupContract], error: Any, raw: Mapping[str, str]) -> Problem:
    # loc is the variable name for values read from the environment and the field name for
    # defaults (pydantic validates those under the field name)
    loc = str(error["loc"][0]) if error["loc"] else "?"
    field = cls.model_fields.get(loc)
    if field is None:
        field = next((f for f in cls.model_fields.values() if env_name(f) == loc), None)
    name = env_name(field) if field is not None else loc
    allowed = allowed_values(field) if field is not None else "?"
    if error["type"] == "missing":
        return Problem(name, None, "required", allowed)
    return Problem(name, raw.get(name), str(error["msg"]).removeprefix("Value error, "), allowed)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    unique = []
    for p in problems:
        if (p.variable, p.message) not in seen:
            seen.add((p.variable, p.message))
            unique.append(p)
    return unique
