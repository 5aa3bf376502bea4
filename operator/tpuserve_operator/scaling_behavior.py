"""How fast an autoscaler may change a TPUModelServer's replicas: the HorizontalPodAutoscaler's
`behavior`, defined once. Pure.

The operator renders a `Behavior` into the HPA (`spec.behavior`) and into KEDA's ScaledObject
(`advanced.horizontalPodAutoscalerConfig.behavior`, which KEDA copies into its own HPA); the
fleet model (`tpuserve.fleet`) applies the same object at each of its decisions (`Stepper`),
with the HPA controller's algorithm (kube-controller-manager's `normalizeDesiredReplicas
WithBehaviors`):

1. **Stabilization.** The recommendation is the current count, raised to the lowest desire of
   the scale-up window and lowered to the highest desire of the scale-down window (each
   window's desires including this decision's).
2. **Rate.** Each policy limits the change within its last ``period_seconds``: ``Pods`` by
   ``value`` replicas, ``Percent`` by ``value`` % of the count at the period's start (the
   current count less the changes the period already made). ``selectPolicy: Max`` takes the
   policy that allows the most change.
3. **Bounds.** minReplicas..maxReplicas.

The defaults (`DEFAULT`) scale with the fleet's size. Scale-up is Kubernetes' own default:
the most of 4 replicas and 100 % (doubling) per 15 s, no window, since a TPU slice serves
minutes after it is asked for and any further wait only delays it. Scale-down, after
``scaleDownStabilizationSeconds`` (300 s) of lower demand: the most of 1 replica and 10 % per
60 s. Kubernetes' default (100 % per 15 s: straight to the window's highest desire) gives up
slices that come back only after a cold start (4-8 minutes) on one low reading; 10 % a minute
halves an overshooting fleet in about 7 minutes, about one cold start, so a fleet sheds a
burst's excess between bursts while one wrong reading costs at most a tenth of it. The 1
replica keeps a fleet of under 10 replicas moving at one a minute.

`ONE_PER_MINUTE` is what the operator rendered before (2026-12-07): one replica a minute up
and down, whatever the fleet's size (250 replicas would take over 4 hours to double from
125); `UP_AT_ONCE_DOWN_ONE_PER_MINUTE` is what the fleet model applied before (up at once,
down one a minute): the earlier autoscaling tables' mechanics, kept to compare against.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

PolicyType = Literal["Pods", "Percent"]
SCALE_UP_PERIOD_SECONDS = 15
SCALE_DOWN_PERIOD_SECONDS = 60
DEFAULT_SCALE_UP_PODS = 4
DEFAULT_SCALE_UP_PERCENT = 100
DEFAULT_SCALE_DOWN_PODS = 1
DEFAULT_SCALE_DOWN_PERCENT = 10
DEFAULT_STABILIZATION_SECONDS = 300
MAX_STABILIZATION_SECONDS = 3600
"""Kubernetes' bound on stabilizationWindowSeconds."""


@dataclass(frozen=True, slots=True)
class Policy:
    """One HPAScalingPolicy: at most ``value`` replicas (Pods) or ``value`` % of the count
    at the period's start (Percent) per ``period_seconds``."""

    type: PolicyType
    value: int
    period_seconds: int

    def __post_init__(self) -> None:
        if self.type not in ("Pods", "Percent"):
            raise ValueError(f"type: {self.type!r} is not allowed; allowed: Pods, Percent")
        if self.value < 1:
            raise ValueError(f"value: {self.value!r} is not allowed; allowed: >= 1")
        if not 1 <= self.period_seconds <= 1800:
            raise ValueError(
                f"period_seconds: {self.period_seconds!r} is not allowed; allowed: 1..1800"
            )

    def manifest(self) -> dict[str, Any]:
        return {"type": self.type, "value": self.value, "periodSeconds": self.period_seconds}


@dataclass(frozen=True, slots=True)
class Rules:
    """One direction's HPAScalingRules (selectPolicy Max: the most permissive policy)."""

    stabilization_seconds: int
    policies: tuple[Policy, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.stabilization_seconds <= MAX_STABILIZATION_SECONDS:
            raise ValueError(
                f"stabilization_seconds: {self.stabilization_seconds!r} is not allowed; "
                f"allowed: 0..{MAX_STABILIZATION_SECONDS}"
            )
        if not self.policies:
            raise ValueError("policies: () is not allowed; allowed: at least one policy")

    def manifest(self) -> dict[str, Any]:
        return {
            "stabilizationWindowSeconds": self.stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [p.manifest() for p in self.policies],
        }

    def longest_period(self) -> int:
        return max(p.period_seconds for p in self.policies)


@dataclass(frozen=True, slots=True)
class Behavior:
    """The HPA's `behavior`: scale-up and scale-down rules."""

    scale_up: Rules
    scale_down: Rules

    def manifest(self) -> dict[str, Any]:
        return {"scaleUp": self.scale_up.manifest(), "scaleDown": self.scale_down.manifest()}


def _policies(pods: int, percent: int, period: int) -> tuple[Policy, ...]:
    out = []
    if pods > 0:
        out.append(Policy("Pods", pods, period))
    if percent > 0:
        out.append(Policy("Percent", percent, period))
    return tuple(out)


def behavior(
    scale_up_pods: int = DEFAULT_SCALE_UP_PODS,
    scale_up_percent: int = DEFAULT_SCALE_UP_PERCENT,
    scale_down_pods: int = DEFAULT_SCALE_DOWN_PODS,
    scale_down_percent: int = DEFAULT_SCALE_DOWN_PERCENT,
    stabilization_seconds: int = DEFAULT_STABILIZATION_SECONDS,
) -> Behavior:
    """The behaviour `AutoscalingSpec`'s fields ask for: scale-up the most of ``scale_up_pods``
    and ``scale_up_percent`` % per `SCALE_UP_PERIOD_SECONDS`, no window; scale-down, after
    ``stabilization_seconds``, the most of ``scale_down_pods`` and ``scale_down_percent`` %
    per `SCALE_DOWN_PERIOD_SECONDS`. A 0 leaves that policy out (one of each pair must be
    above 0)."""
    return Behavior(
        Rules(0, _policies(scale_up_pods, scale_up_percent, SCALE_UP_PERIOD_SECONDS)),
        Rules(
            stabilization_seconds,
            _policies(scale_down_pods, scale_down_percent, SCALE_DOWN_PERIOD_SECONDS),
        ),
    )


DEFAULT = behavior()
ONE_PER_MINUTE = Behavior(
    Rules(0, (Policy("Pods", 1, 60),)),
    Rules(DEFAULT_STABILIZATION_SECONDS, (Policy("Pods", 1, 60),)),
)
UP_AT_ONCE_DOWN_ONE_PER_MINUTE = Behavior(
    Rules(0, (Policy("Percent", 100_000, 15),)),
    Rules(DEFAULT_STABILIZATION_SECONDS, (Policy("Pods", 1, 60),)),
)
NAMED: dict[str, Behavior] = {
    "default": DEFAULT,
    "one-per-minute": ONE_PER_MINUTE,
    "up-at-once-down-one-per-minute": UP_AT_ONCE_DOWN_ONE_PER_MINUTE,
}
"""The behaviours the fleet model's benchmarks name (`bench/autoscaling_day.py --behavior`)."""


def limit_up(rules: Rules, current: int, added: list[int], removed: list[int]) -> int:
    """The most replicas scale-up allows: per policy (``added[i]``/``removed[i]``: replicas
    added/removed within policy i's period), the count at the period's start plus the policy's
    allowance; the most of them (selectPolicy Max)."""
    out = []
    for p, plus, minus in zip(rules.policies, added, removed, strict=True):
        start = current - plus + minus
        if p.type == "Pods":
            out.append(start + p.value)
        else:
            out.append(math.ceil(start * (1 + p.value / 100)))
    return max(out)


def limit_down(rules: Rules, current: int, added: list[int], removed: list[int]) -> int:
    """The fewest replicas scale-down allows: per policy, the count at the period's start less
    the policy's allowance (Percent rounded down, as the HPA does); the fewest of them
    (selectPolicy Max: the most change)."""
    out = []
    for p, plus, minus in zip(rules.policies, added, removed, strict=True):
        start = current + minus - plus
        if p.type == "Pods":
            out.append(start - p.value)
        else:
            out.append(math.floor(start * (1 - p.value / 100)))
    return min(out)


class Stepper:
    """The HPA controller's state for one scale target under a `Behavior`: the desires of the
    stabilization windows and the scale events of the policies' periods. `step` turns a
    decision's desired count into the count to scale to now.

    A desire exactly one window old still counts (the fleet model decides on exact multiples
    of its interval; the controller, with jitter, never lands on the boundary), and a scale
    event exactly one period old no longer does (the controller's own cut-off)."""

    def __init__(self, behavior: Behavior) -> None:
        self.behavior = behavior
        self.desires: deque[tuple[float, int]] = deque()
        self.events: deque[tuple[float, int]] = deque()  # (time, +added or -removed)
        self.keep = max(
            behavior.scale_up.stabilization_seconds, behavior.scale_down.stabilization_seconds
        )
        self.keep_events = max(
            behavior.scale_up.longest_period(), behavior.scale_down.longest_period()
        )

    def step(self, now: float, current: int, desired: int, lo: int, hi: int) -> int:
        """The count to scale to at ``now`` from ``current``, the rule's ``desired`` (already
        within ``lo..hi``) and the history; records the desire and the change."""
        b = self.behavior
        self.desires.append((now, desired))
        while self.desires[0][0] < now - self.keep:
            self.desires.popleft()
        while self.events and self.events[0][0] <= now - self.keep_events:
            self.events.popleft()
        up_cut = now - b.scale_up.stabilization_seconds
        down_cut = now - b.scale_down.stabilization_seconds
        up = min(d for t, d in self.desires if t >= up_cut)
        down = max(d for t, d in self.desires if t >= down_cut)
        target = current
        if target < up:
            target = up
        if target > down:
            target = down
        if target > current:
            rules = b.scale_up
            added, removed = self._changes(now, rules)
            target = min(target, limit_up(rules, current, added, removed), hi)
        elif target < current:
            rules = b.scale_down
            added, removed = self._changes(now, rules)
            target = max(target, limit_down(rules, current, added, removed), lo)
        if target != current:
            self.events.append((now, target - current))
        return target

    def _changes(self, now: float, rules: Rules) -> tuple[list[int], list[int]]:
        added, removed = [], []
        for p in rules.policies:
            cut = now - p.period_seconds
            added.append(sum(c for t, c in self.events if t > cut and c > 0))
            removed.append(sum(-c for t, c in self.events if t > cut and c < 0))
        return added, removed
