"""When a child must be (re)applied: missing, changed spec, or edited by someone else. Pure.

Every applied child carries the hash of the manifest the operator applied
(`serving.tpuserve.dev/spec-hash`). The operator also remembers, per child, the
`metadata.generation` (or, for kinds without one, the `resourceVersion`) its own apply
returned. A child is re-applied when it is missing, its hash differs from the desired
manifest's, or its generation/resourceVersion moved past what the operator's apply left,
which means someone else edited it. Server-side apply with `force` then takes the operator's
fields back. After an operator restart nothing is remembered, so the first pass re-applies
everything once (a no-op for unchanged objects).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve_operator import labels
from tpuserve_operator.observed import ChildView
from tpuserve_operator.render.context import stable_hash


@dataclass(frozen=True, slots=True)
class AppliedRecord:
    """What the operator's last apply of a child returned."""

    spec_hash: str
    generation: int | None
    resource_version: str


def stamp(manifest: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The manifest with its own hash annotated, and that hash."""
    digest = stable_hash(manifest, length=16)
    out = copy.deepcopy(dict(manifest))
    out["metadata"].setdefault("annotations", {})[labels.SPEC_HASH] = digest
    return out, digest


def record_of(applied: Mapping[str, Any], spec_hash: str) -> AppliedRecord:
    meta = applied.get("metadata") or {}
    generation = meta.get("generation")
    return AppliedRecord(
        spec_hash=spec_hash,
        generation=int(generation) if generation is not None else None,
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def _older(observed: str, recorded: str) -> bool:
    """True when the observed resourceVersion predates the recorded one (a stale cache).

    resourceVersions are opaque, but etcd-backed apiservers hand out increasing integers;
    anything else counts as not older, which only costs a no-op apply.
    """
    if observed.isdigit() and recorded.isdigit():
        return int(observed) < int(recorded)
    return False


WRITTEN_BY_OTHERS = frozenset({"Lease", labels.ROLE_KIND})
"""Kinds others write to by design (routers renew the demand Lease, an HPA scales a
TPUModelServerRole): their moving generation or resourceVersion is not a hand edit, so only a
changed manifest re-applies them."""


def needs_apply(
    desired_hash: str, observed: ChildView | None, record: AppliedRecord | None
) -> bool:
    if observed is None:
        return True
    if observed.deleting:
        return False  # recreate it once it is gone
    if record is not None and _older(observed.resource_version, record.resource_version):
        return record.spec_hash != desired_hash  # the cache lags our own apply
    if observed.spec_hash != desired_hash or record is None:
        return True
    if observed.kind in WRITTEN_BY_OTHERS:
        return False
    if observed.generation is not None and record.generation is not None:
        return observed.generation != record.generation
    return observed.resource_version != record.resource_version
