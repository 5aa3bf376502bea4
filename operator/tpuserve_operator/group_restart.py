"""Restart a multi-host replica group as one when any of its pods restarts.

A multi-host slice runs one distributed program: when one host's pod restarts (its container
restarted, or the pod was deleted or evicted and recreated), the other hosts are left in a
broken collective and never recover on their own. LeaderWorkerSet does this itself
(`RecreateGroupOnPodRestart`) but misses a worker that is gone before its reconcile sees it
terminating (`restarts`); the operator does it on both paths: it remembers each group's pods
(identity and restart count) once every host runs, and when one of them changes it deletes
the group's other pods, so the StatefulSets (or the LeaderWorkerSet) recreate the whole group
together.

Pure: `check` takes what the operator remembers and what it sees, and says what to delete.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from tpuserve_operator.observed import PodView

Incarnation = tuple[str, int]
"""A pod's identity (uid) and its containers' restart count."""

Epoch = Mapping[str, Incarnation]
"""Pod name -> incarnation, for every host of a group that was running as one."""


@dataclass(frozen=True, slots=True)
class Verdict:
    epoch: Epoch | None  # what to remember next (None: the group is not running as one)
    delete: tuple[str, ...] = ()  # pods to delete so the group restarts together
    cause: str = ""  # the pod that restarted, for the Event


def incarnation(pod: PodView) -> Incarnation:
    return (pod.uid, pod.restarts)


def check(
    epoch: Epoch | None,
    pods: Sequence[PodView],
    hosts: int,
    condemned: Collection[str] = (),
) -> Verdict:
    """What to do with one group, given the epoch remembered for it (None: none yet).

    ``condemned``: uids of pods the operator already deleted, counted as gone even while a
    lagging watch still shows them alive (else they could found a new epoch and, once their
    deletion shows, restart the group a second time)."""
    live = [p for p in pods if not p.deleting and p.uid not in condemned]
    if epoch is None:
        if len(live) == hosts and all(p.running for p in live):
            return Verdict({p.name: incarnation(p) for p in live})
        return Verdict(None)
    current = {p.name: p for p in live}
    survivors: list[str] = []
    changed: list[str] = []
    for name, seen in epoch.items():
        pod = current.get(name)
        (survivors if pod is not None and incarnation(pod) == seen else changed).append(name)
    if not changed:
        return Verdict(epoch)
    return Verdict(None, tuple(sorted(survivors)), min(changed))
