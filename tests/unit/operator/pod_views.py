"""One builder of `PodView`s for the operator's unit tests: a running, ready pod of group 0."""

from __future__ import annotations

import dataclasses
from typing import Any

from tpuserve_operator.observed import PodView

RUNNING = PodView(
    name="",
    replica=0,
    role="worker",
    revision="rev1",
    phase="Running",
    ready=True,
    running=True,
    deleting=False,
    unschedulable=None,
    crash_loop=None,
    restarts=0,
    created="",
)


def make_pod(name: str, *, running: bool = True, **changes: Any) -> PodView:
    """A pod named ``name``; ``running=False`` makes it Pending and not ready."""
    if not running:
        changes |= {"phase": "Pending", "running": False, "ready": False}
    return dataclasses.replace(RUNNING, name=name, **changes)
