"""Node disruption signals: which label or taint means what, and which groups must move."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from tpuserve_operator.conditions import Reason
from tpuserve_operator.node_signals import (
    ACTIVE_MAINTENANCE_LABEL,
    MAINTENANCE_TIME_LABEL,
    TERMINATION_TAINT,
    NodeSignals,
    PodPlacement,
    affected_groups,
    by_urgency,
    signal_of,
)

pytestmark = pytest.mark.unit

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def node(
    name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}


def pod(replica: int, node_name: str, created: datetime.datetime) -> PodPlacement:
    return PodPlacement(replica, node_name, created)


def test_a_plain_node_signals_nothing() -> None:
    assert signal_of(node("n", {"cloud.google.com/gke-nodepool": "p"})) is None


def test_scheduled_maintenance_is_read_from_the_epoch_label() -> None:
    signal = signal_of(node("n", {MAINTENANCE_TIME_LABEL: "1798804800"}))
    assert signal is not None
    assert signal.reason == Reason.NODE_MAINTENANCE_SCHEDULED
    assert "2027-01-01T12:00:00Z" in signal.message


def test_the_termination_taint_and_active_maintenance_are_urgent() -> None:
    tainted = node("n", {MAINTENANCE_TIME_LABEL: "1"}, [{"key": TERMINATION_TAINT}])
    active = node("m", {ACTIVE_MAINTENANCE_LABEL: "true"})
    for n in (tainted, active):
        signal = signal_of(n)
        assert signal is not None
        assert signal.reason == Reason.NODE_TERMINATING


def test_only_pods_placed_before_the_signal_was_seen_move() -> None:
    signals = NodeSignals()
    assert signals.update(node("a", {MAINTENANCE_TIME_LABEL: "1"}), T0, deleted=False)
    later = T0 + datetime.timedelta(seconds=5)
    pods = [pod(0, "a", T0 - datetime.timedelta(hours=1)), pod(1, "a", later), pod(2, "b", T0)]
    assert set(affected_groups(pods, signals)) == {0}


def test_a_signal_keeps_when_it_was_first_seen_and_clears_when_the_label_goes() -> None:
    signals = NodeSignals()
    signals.update(node("a", {MAINTENANCE_TIME_LABEL: "1"}), T0, deleted=False)
    later = T0 + datetime.timedelta(minutes=1)
    assert signals.update(node("a", {ACTIVE_MAINTENANCE_LABEL: "true"}), later, deleted=False)
    seen = signals.get("a")
    assert seen is not None
    assert seen.since == T0
    assert not signals.update(node("a", {ACTIVE_MAINTENANCE_LABEL: "true"}), later, deleted=False)
    assert signals.update(node("a"), later, deleted=False)
    assert signals.get("a") is None


def test_a_deleted_node_drops_its_signal() -> None:
    signals = NodeSignals()
    signals.update(node("a", {MAINTENANCE_TIME_LABEL: "1"}), T0, deleted=False)
    assert signals.update(node("a", {MAINTENANCE_TIME_LABEL: "1"}), T0, deleted=True)
    assert signals.get("a") is None


def test_groups_are_split_into_moving_and_urgent() -> None:
    signals = NodeSignals()
    signals.update(node("a", {MAINTENANCE_TIME_LABEL: "1"}), T0, deleted=False)
    signals.update(node("b", taints=[{"key": TERMINATION_TAINT}]), T0, deleted=False)
    early = T0 - datetime.timedelta(hours=1)
    displaced = affected_groups([pod(0, "a", early), pod(1, "b", early)], signals)
    assert by_urgency(displaced) == (frozenset({0}), frozenset({1}))
