"""Condition types, their reasons, and how a condition list changes. Pure functions.

Conditions follow metav1.Condition: a list keyed by `type`; `reason` is a CamelCase
identifier for programs, `message` a sentence; `lastTransitionTime` changes only when
`status` does. Every reason the operator can write is listed in REASONS (docs/operator.md
is generated from it, and a test checks the operator writes no other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

VALID = "Valid"
PROGRESSING = "Progressing"
READY = "Ready"
DEGRADED = "Degraded"
TYPES = (VALID, PROGRESSING, READY, DEGRADED)

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, slots=True)
class ReasonDoc:
    type: str
    status: Status
    reason: str
    meaning: str


REASONS: tuple[ReasonDoc, ...] = (
    ReasonDoc(
        VALID, "True", "SpecValid", "the spec passed the CRD rules, the catalog and the fit check"
    ),
    ReasonDoc(VALID, "False", "InvalidSpec", "a field has a value the operator cannot use"),
    ReasonDoc(VALID, "False", "FailedValidationRule", "a CEL rule of the CRD failed"),
    ReasonDoc(
        VALID, "False", "UnsupportedTopology", "(generation, topology) is not in the catalog"
    ),
    ReasonDoc(
        VALID, "False", "ModelDoesNotFit", "weights + one context of KV exceed the slice's HBM"
    ),
    ReasonDoc(VALID, "False", "UnknownModel", "the simulated engine has no profile for the model"),
    ReasonDoc(VALID, "False", "ReservedField", "an override sets something the operator owns"),
    ReasonDoc(PROGRESSING, "True", "Reconciling", "children are being created or updated"),
    ReasonDoc(
        PROGRESSING, "True", "RollingUpdate", "replica groups are being replaced, one at a time"
    ),
    ReasonDoc(PROGRESSING, "True", "ScalingUp", "replica groups are being added"),
    ReasonDoc(PROGRESSING, "True", "ScalingDown", "replica groups are being removed"),
    ReasonDoc(PROGRESSING, "True", "GroupsStarting", "groups exist but not all are ready yet"),
    ReasonDoc(PROGRESSING, "False", "Complete", "every group is on the current revision and ready"),
    ReasonDoc(
        PROGRESSING, "False", "InvalidSpec", "nothing is rolled out while the spec is invalid"
    ),
    ReasonDoc(PROGRESSING, "False", "ApplyFailed", "the apiserver refused a child (see message)"),
    ReasonDoc(READY, "True", "RouterReady", "the router is up and at least one group is ready"),
    ReasonDoc(READY, "True", "LeadersReady", "router disabled; at least one group is ready"),
    ReasonDoc(READY, "False", "NoReadyReplicas", "no replica group is ready"),
    ReasonDoc(READY, "False", "RouterNotReady", "groups are ready but no router pod is"),
    ReasonDoc(READY, "False", "ScaledToZero", "spec.replicas is 0"),
    ReasonDoc(READY, "False", "InvalidSpec", "the spec is invalid; nothing is served"),
    ReasonDoc(
        DEGRADED, "True", "Unschedulable", "pods cannot be scheduled (no matching TPU capacity)"
    ),
    ReasonDoc(DEGRADED, "True", "CrashLoop", "an engine container is crash-looping"),
    ReasonDoc(
        DEGRADED, "True", "GroupPartiallyUp", "a group has had only some hosts running for too long"
    ),
    ReasonDoc(DEGRADED, "True", "ApplyFailed", "the apiserver refused a child (see message)"),
    ReasonDoc(DEGRADED, "False", "AsExpected", "nothing is wrong"),
    ReasonDoc(DEGRADED, "False", "InvalidSpec", "the spec is invalid; see Valid"),
)


@dataclass(frozen=True, slots=True)
class Condition:
    """A condition as the operator decides it, before timestamps."""

    type: str
    status: Status
    reason: str
    message: str

    @classmethod
    def of(cls, type_: str, ok: bool, reason: str, message: str) -> Condition:
        return cls(type_, "True" if ok else "False", reason, message)


def find(conditions: Sequence[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def merge(
    existing: Sequence[dict[str, Any]],
    decided: Sequence[Condition],
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The new condition list: decided conditions replace theirs by type, keeping
    `lastTransitionTime` when the status did not change; others are kept as they were."""
    out: list[dict[str, Any]] = []
    by_type = {c.type: c for c in decided}
    out += [dict(c) for c in existing if c.get("type") not in by_type]
    for new in decided:
        previous = find(existing, new.type)
        same = previous is not None and previous.get("status") == new.status
        since = previous.get("lastTransitionTime") if previous is not None and same else None
        item: dict[str, Any] = {
            "type": new.type,
            "status": new.status,
            "reason": new.reason,
            "message": new.message,
            "lastTransitionTime": since or now,
        }
        if generation is not None:
            item["observedGeneration"] = generation
        out.append(item)
    order = {t: i for i, t in enumerate(TYPES)}
    return sorted(out, key=lambda c: order.get(str(c.get("type")), len(order)))


@dataclass(frozen=True, slots=True)
class Transition:
    """A condition whose status or reason changed: worth an Event."""

    condition: Condition
    previous_status: str | None
    previous_reason: str | None

    @property
    def warning(self) -> bool:
        """Events of type Warning: Degraded set, the spec invalid, readiness lost, apply errors."""
        c = self.condition
        if c.type == DEGRADED:
            return c.status == "True"
        if c.type == PROGRESSING:
            return c.reason == "ApplyFailed"
        if c.type == READY:
            return c.status == "False" and self.previous_status == "True"
        return c.status == "False"


def transitions(
    existing: Sequence[dict[str, Any]], decided: Sequence[Condition]
) -> list[Transition]:
    out = []
    for new in decided:
        old = find(existing, new.type)
        old_status = old.get("status") if old else None
        old_reason = old.get("reason") if old else None
        if old_status != new.status or old_reason != new.reason:
            out.append(Transition(new, old_status, old_reason))
    return out
