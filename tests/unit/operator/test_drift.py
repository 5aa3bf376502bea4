"""Drift detection: a child is re-applied when missing, changed, or edited by someone else,
and not when the watch cache merely lags the operator's own apply."""

from __future__ import annotations

import dataclasses

import pytest

from tpuserve_operator import labels
from tpuserve_operator.drift import AppliedRecord, needs_apply, record_of, stamp
from tpuserve_operator.observed import ChildView

pytestmark = pytest.mark.unit


def view(
    spec_hash: str = "h1", generation: int | None = 3, rv: str = "100", deleting: bool = False
) -> ChildView:
    return ChildView(
        api_version="apps/v1",
        kind="StatefulSet",
        name="x",
        uid="u",
        owner_uid="o",
        generation=generation,
        resource_version=rv,
        spec_hash=spec_hash,
        revision=None,
        replica=None,
        deleting=deleting,
        ready_replicas=0,
    )


def test_missing_children_are_applied() -> None:
    assert needs_apply("h1", None, None)


def test_a_changed_manifest_is_applied() -> None:
    assert needs_apply("h2", view(), AppliedRecord("h1", 3, "100"))


def test_nothing_changed_nothing_applied() -> None:
    assert not needs_apply("h1", view(), AppliedRecord("h1", 3, "100"))


def test_first_pass_after_a_restart_reapplies_once() -> None:
    assert needs_apply("h1", view(), None)


def test_a_hand_edit_bumps_generation_and_is_reverted() -> None:
    assert needs_apply("h1", view(generation=4, rv="120"), AppliedRecord("h1", 3, "100"))


def test_status_updates_do_not_trigger_applies_for_kinds_with_generation() -> None:
    assert not needs_apply("h1", view(generation=3, rv="150"), AppliedRecord("h1", 3, "100"))


def test_kinds_without_generation_use_resource_version() -> None:
    assert needs_apply("h1", view(generation=None, rv="150"), AppliedRecord("h1", None, "100"))
    assert not needs_apply("h1", view(generation=None, rv="100"), AppliedRecord("h1", None, "100"))


def test_a_lagging_cache_is_not_mistaken_for_an_edit() -> None:
    # we applied h2 (rv 200); the cache still shows the object before our apply
    assert not needs_apply("h2", view(spec_hash="h1", rv="150"), AppliedRecord("h2", 4, "200"))


def test_deleting_children_wait_until_gone() -> None:
    assert not needs_apply("h1", view(deleting=True), None)


def test_stamp_annotates_the_hash_without_touching_the_input() -> None:
    manifest = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}
    stamped, digest = stamp(manifest)
    assert stamped["metadata"]["annotations"][labels.SPEC_HASH] == digest
    assert "annotations" not in manifest["metadata"]
    assert stamp(manifest)[1] == digest
    record = record_of({"metadata": {"generation": 2, "resourceVersion": "7"}}, digest)
    assert record == AppliedRecord(digest, 2, "7")


def test_a_lease_renewed_by_routers_is_not_taken_for_a_hand_edit() -> None:
    lease = dataclasses.replace(view(generation=None, rv="150"), kind="Lease")
    assert not needs_apply("h1", lease, AppliedRecord("h1", None, "100"))
    assert needs_apply("h2", lease, AppliedRecord("h1", None, "100"))  # our manifest changed
