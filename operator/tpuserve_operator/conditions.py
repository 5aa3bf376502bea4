"""Condition types, every reason the operator writes, and how a condition list changes. Pure.

Conditions follow metav1.Condition: a list keyed by `type`; `reason` is a CamelCase
identifier for programs, `message` a sentence; `lastTransitionTime` changes only when
`status` does. Every reason is a member of `Reason`; the condition reasons are documented in
REASONS (docs/operator.md is generated from it, and a test checks the operator writes no
other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from sglang_tpu import preflight
from tpuserve_operator import api

VALID = "Valid"
PROGRESSING = "Progressing"
READY = "Ready"
DEGRADED = "Degraded"
TYPES = (VALID, PROGRESSING, READY, DEGRADED)

Status = Literal["True", "False", "Unknown"]


class Reason(StrEnum):
    """Every reason the operator writes: in conditions, replica groups' status and Events."""

    # Valid
    SPEC_VALID = "SpecValid"
    INVALID_SPEC = "InvalidSpec"
    FAILED_VALIDATION_RULE = "FailedValidationRule"
    UNSUPPORTED_TOPOLOGY = "UnsupportedTopology"
    MODEL_DOES_NOT_FIT = "ModelDoesNotFit"
    UNKNOWN_MODEL = "UnknownModel"
    RESERVED_FIELD = "ReservedField"
    UNSUPPORTED_TRANSFER_BACKEND = "UnsupportedTransferBackend"
    UNPAIRABLE_ROLES = "UnpairableRoles"
    HOST_KV_DOES_NOT_FIT = "HostKvCacheDoesNotFit"
    SLO_NOT_MET = "SloNotMet"
    # Progressing
    RECONCILING = "Reconciling"
    ROLLING_UPDATE = "RollingUpdate"
    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"
    GROUPS_STARTING = "GroupsStarting"
    ACTIVATING = "Activating"
    COMPLETE = "Complete"
    APPLY_FAILED = "ApplyFailed"
    NODE_MAINTENANCE_SCHEDULED = "NodeMaintenanceScheduled"
    NODE_TERMINATING = "NodeTerminating"
    # Ready
    ROUTER_READY = "RouterReady"
    LEADERS_READY = "LeadersReady"
    NO_READY_REPLICAS = "NoReadyReplicas"
    ROUTER_NOT_READY = "RouterNotReady"
    SCALED_TO_ZERO = "ScaledToZero"
    # Degraded (the first three are also a replica group's reason)
    UNSCHEDULABLE = "Unschedulable"
    CRASH_LOOP = "CrashLoop"
    GROUP_PARTIALLY_UP = "GroupPartiallyUp"
    AS_EXPECTED = "AsExpected"
    # Degraded, and a replica group's reason: the launcher's pre-flight refused to start
    # (the same values as sglang_tpu.preflight.Reason; a test keeps them equal)
    TPU_STACK_MISSING = "TPUStackMissing"
    TPU_STACK_INCOMPATIBLE = "TPUStackIncompatible"
    TPU_PROBE_FAILED = "TPUProbeFailed"
    ACCELERATOR_MISMATCH = "AcceleratorMismatch"
    CHIP_COUNT_MISMATCH = "ChipCountMismatch"
    HBM_MISMATCH = "HBMMismatch"
    EXECUTION_MODE_UNSUPPORTED = "ExecutionModeUnsupported"
    COMPILE_CACHE_UNWRITABLE = "CompileCacheUnwritable"
    # A replica group's state (status.groups[].reason) only
    CREATING = "Creating"
    DELETING = "Deleting"
    SERVING = "Serving"
    STARTING = "Starting"
    PARTIALLY_UP = "PartiallyUp"
    # Events only
    GROUP_RESTARTED = "GroupRestarted"
    GROUP_DRAINING = "GroupDraining"
    NODE_LOST = "NodeLost"


@dataclass(frozen=True, slots=True)
class ReasonDoc:
    type: str
    status: Status
    reason: Reason
    meaning: str


REASONS: tuple[ReasonDoc, ...] = (
    ReasonDoc(
        VALID,
        "True",
        Reason.SPEC_VALID,
        "the spec passed the CRD rules, the catalog and the fit check",
    ),
    ReasonDoc(VALID, "False", Reason.INVALID_SPEC, "a field has a value the operator cannot use"),
    ReasonDoc(VALID, "False", Reason.FAILED_VALIDATION_RULE, "a CEL rule of the CRD failed"),
    ReasonDoc(
        VALID, "False", Reason.UNSUPPORTED_TOPOLOGY, "(generation, topology) is not in the catalog"
    ),
    ReasonDoc(
        VALID,
        "False",
        Reason.MODEL_DOES_NOT_FIT,
        "weights + one context of KV exceed the slice's HBM",
    ),
    ReasonDoc(
        VALID, "False", Reason.UNKNOWN_MODEL, "the simulated engine has no profile for the model"
    ),
    ReasonDoc(
        VALID,
        "False",
        Reason.SLO_NOT_MET,
        "no slice the operator may plan on serves spec.demand within spec.slo",
    ),
    ReasonDoc(
        VALID, "False", Reason.RESERVED_FIELD, "an override sets something the operator owns"
    ),
    ReasonDoc(
        VALID,
        "False",
        Reason.UNSUPPORTED_TRANSFER_BACKEND,
        "disaggregation.transferBackend cannot move KV between this engine's slices",
    ),
    ReasonDoc(
        VALID,
        "False",
        Reason.UNPAIRABLE_ROLES,
        "the prefill and decode roles cannot pair: engine versions, TP, page size or KV dtype",
    ),
    ReasonDoc(
        VALID,
        "False",
        Reason.HOST_KV_DOES_NOT_FIT,
        "kvCache.host is larger than the engine's host memory leaves to it",
    ),
    ReasonDoc(PROGRESSING, "True", Reason.RECONCILING, "children are being created or updated"),
    ReasonDoc(
        PROGRESSING,
        "True",
        Reason.ROLLING_UPDATE,
        "replica groups are being replaced, one at a time",
    ),
    ReasonDoc(PROGRESSING, "True", Reason.SCALING_UP, "replica groups are being added"),
    ReasonDoc(PROGRESSING, "True", Reason.SCALING_DOWN, "replica groups are being removed"),
    ReasonDoc(
        PROGRESSING, "True", Reason.GROUPS_STARTING, "groups exist but not all are ready yet"
    ),
    ReasonDoc(
        PROGRESSING,
        "True",
        Reason.NODE_MAINTENANCE_SCHEDULED,
        "a group moves off a node with upcoming maintenance (a surge group first, if allowed)",
    ),
    ReasonDoc(
        PROGRESSING,
        "True",
        Reason.NODE_TERMINATING,
        "a group is replaced because its node is being terminated (maintenance or preemption)",
    ),
    ReasonDoc(
        PROGRESSING,
        "True",
        Reason.ACTIVATING,
        "scaling from zero on demand: the router holds requests until the first slice is ready",
    ),
    ReasonDoc(
        PROGRESSING, "False", Reason.COMPLETE, "every group is on the current revision and ready"
    ),
    ReasonDoc(
        PROGRESSING, "False", Reason.INVALID_SPEC, "nothing is rolled out while the spec is invalid"
    ),
    ReasonDoc(
        PROGRESSING, "False", Reason.APPLY_FAILED, "the apiserver refused a child (see message)"
    ),
    ReasonDoc(
        READY, "True", Reason.ROUTER_READY, "the router is up and at least one group is ready"
    ),
    ReasonDoc(READY, "True", Reason.LEADERS_READY, "router disabled; at least one group is ready"),
    ReasonDoc(READY, "False", Reason.NO_READY_REPLICAS, "no replica group is ready"),
    ReasonDoc(READY, "False", Reason.ROUTER_NOT_READY, "groups are ready but no router pod is"),
    ReasonDoc(
        READY,
        "False",
        Reason.SCALED_TO_ZERO,
        "spec.replicas is 0 (with autoscaling.minReplicas 0: idle; the next request activates it)",
    ),
    ReasonDoc(READY, "False", Reason.INVALID_SPEC, "the spec is invalid; nothing is served"),
    ReasonDoc(
        DEGRADED,
        "True",
        Reason.UNSCHEDULABLE,
        "pods cannot be scheduled (no matching TPU capacity)",
    ),
    ReasonDoc(DEGRADED, "True", Reason.CRASH_LOOP, "an engine container is crash-looping"),
    ReasonDoc(
        DEGRADED,
        "True",
        Reason.GROUP_PARTIALLY_UP,
        "a group has had only some hosts running for too long",
    ),
    *(
        ReasonDoc(
            DEGRADED,
            "True",
            Reason(reason),
            f"the engine's pre-flight refused to start: {meaning}",
        )
        for reason, meaning in preflight.REASON_MEANINGS.items()
    ),
    ReasonDoc(DEGRADED, "True", Reason.APPLY_FAILED, "the apiserver refused a child (see message)"),
    ReasonDoc(DEGRADED, "False", Reason.AS_EXPECTED, "nothing is wrong"),
    ReasonDoc(DEGRADED, "False", Reason.INVALID_SPEC, "the spec is invalid; see Valid"),
)


@dataclass(frozen=True, slots=True)
class Condition:
    """A condition as the operator decides it, before timestamps."""

    type: str
    status: Status
    reason: Reason
    message: str

    @classmethod
    def of(cls, type_: str, ok: bool, reason: Reason, message: str) -> Condition:
        return cls(type_, "True" if ok else "False", reason, message)


def find(conditions: Sequence[api.Condition], type_: str) -> api.Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def merge(
    existing: Sequence[api.Condition],
    decided: Sequence[Condition],
    *,
    now: str,
    generation: int | None,
) -> list[api.Condition]:
    """The new condition list: decided conditions replace theirs by type, keeping
    `lastTransitionTime` when the status did not change; others are kept as they were."""
    by_type = {c.type: c for c in decided}
    out = [c for c in existing if c.type not in by_type]
    for new in decided:
        previous = find(existing, new.type)
        same = previous is not None and previous.status == new.status
        fields: dict[str, object] = {
            "type": new.type,
            "status": new.status,
            "reason": str(new.reason),
            "message": new.message,
            "last_transition_time": previous.last_transition_time
            if previous is not None and same
            else now,
        }
        if generation is not None:
            fields["observed_generation"] = generation
        out.append(api.Condition.model_validate(fields))
    order = {t: i for i, t in enumerate(TYPES)}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


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
            return c.reason == Reason.APPLY_FAILED
        if c.type == READY:
            return c.status == "False" and self.previous_status == "True"
        return c.status == "False"


def transitions(
    existing: Sequence[api.Condition], decided: Sequence[Condition]
) -> list[Transition]:
    out = []
    for new in decided:
        old = find(existing, new.type)
        old_status = old.status if old else None
        old_reason = old.reason if old else None
        if old_status != new.status or old_reason != new.reason:
            out.append(Transition(new, old_status, old_reason))
    return out
