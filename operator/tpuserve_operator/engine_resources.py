"""CPU and memory of the engine container: derived from the catalog, overridable, checked.

On TPU (`engine.type: sglang`) each engine pod has its host to itself (it takes every chip),
so what it may use is the host's node allocatable (GKE's reservations for the kubelet and the
system taken off the machine type's vCPUs and memory, `sglang_tpu.topology.MachineType`) less
a share left to the node's DaemonSets (logging, metrics, the TPU device plugin, CSI drivers,
GKE's FUSE sidecar). Requests equal limits (Guaranteed QoS): an engine cannot take memory or
CPU its neighbours were promised, and is the last pod the kubelet evicts under pressure.

`spec.engine.resources` overrides any of `requests.cpu`, `requests.memory`, `limits.cpu`,
`limits.memory`; a limit given alone also lowers the default request to it, a request given
alone raises the default limit to it. `problems` names
every override that cannot work: not a quantity, not positive, a request above its limit, or
(on TPU) more than one host's allocatable, which no node could ever schedule. The simulated
engine runs on CPU nodes of unknown size: it gets exactly what the spec says, checked the same
way less the host bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from kubernetes.utils.quantity import parse_quantity

from sglang_tpu.topology import MIB, MachineType
from tpuserve_operator.errors import Problem

HOST_RESOURCES: Final = ("cpu", "memory")
DAEMONSET_SHARE: Final = Decimal("0.1")
"""The share of a host's allocatable CPU and memory left to the node's other pods."""


def defaults(machine: MachineType) -> dict[str, Decimal]:
    """The engine's CPU (cores) and memory (bytes) on one host of this machine type."""
    keep = 1 - DAEMONSET_SHARE
    cpu = (Decimal(machine.allocatable_millicpu) * keep).to_integral_value(rounding="ROUND_FLOOR")
    memory = (Decimal(machine.allocatable_bytes) * keep / MIB).to_integral_value(
        rounding="ROUND_FLOOR"
    )
    return {"cpu": cpu / 1000, "memory": memory * MIB}


def allocatable(machine: MachineType) -> dict[str, Decimal]:
    return {
        "cpu": Decimal(machine.allocatable_millicpu) / 1000,
        "memory": Decimal(machine.allocatable_bytes),
    }


def render_quantity(resource: str, amount: Decimal) -> str:
    """Millicores for CPU (`161532m`), MiB for memory (`628867Mi`)."""
    if resource == "cpu":
        return f"{int(amount * 1000)}m"
    return f"{int(amount // MIB)}Mi"


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value (`64Gi`, `500m`, 8), or None for anything else."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation):
        return None


def _section(resources: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    amounts = resources.get(section)
    return amounts if isinstance(amounts, Mapping) else {}


def problems(
    resources: Mapping[str, Any], machine: MachineType | None, field: str = "spec.engine.resources"
) -> list[Problem]:
    """Every cpu/memory override that cannot work (`machine`: the host on TPU, else None)."""
    found: list[Problem] = []
    bound = allocatable(machine) if machine is not None else None
    for resource in HOST_RESOURCES:
        amounts: dict[str, Decimal] = {}
        for section in ("requests", "limits"):
            value = _section(resources, section).get(resource)
            if value is None:
                continue
            path = f"{field}.{section}.{resource}"
            amount = quantity(value)
            if amount is None or amount <= 0:
                found.append(
                    Problem(
                        path,
                        f"{value!r} is not allowed; allowed: a positive Kubernetes quantity "
                        "(e.g. 8, 500m, 64Gi)",
                    )
                )
                continue
            amounts[section] = amount
            if bound is not None and machine is not None and amount > bound[resource]:
                found.append(
                    Problem(
                        path,
                        f"{value!r} is more than one {machine.name} host leaves to pods; "
                        f"allowed: at most {render_quantity(resource, bound[resource])}",
                    )
                )
        request, limit = amounts.get("requests"), amounts.get("limits")
        if request is not None and limit is not None and request > limit:
            found.append(
                Problem(
                    f"{field}.requests.{resource}",
                    f"{_section(resources, 'requests')[resource]!r} is above "
                    f"{field}.limits.{resource} "
                    f"({_section(resources, 'limits')[resource]!r}); allowed: at most the limit",
                )
            )
    return found


def engine_requirements(
    resources: Mapping[str, Any], machine: MachineType | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(requests, limits) of cpu and memory: the spec's values, the catalog's for the rest
    (`machine` None: the spec's values alone). Call after `problems` found none."""
    requests = dict(_section(resources, "requests"))
    limits = dict(_section(resources, "limits"))
    if machine is None:
        return requests, limits
    derived = defaults(machine)
    for resource in HOST_RESOURCES:
        if resource not in limits:
            request = quantity(requests.get(resource))
            above = request is not None and request > derived[resource]
            limits[resource] = (
                requests[resource] if above else render_quantity(resource, derived[resource])
            )
        if resource not in requests:
            limit = quantity(limits[resource])
            amount = derived[resource] if limit is None else min(derived[resource], limit)
            requests[resource] = (
                limits[resource] if amount == limit else render_quantity(resource, amount)
            )
    return requests, limits
