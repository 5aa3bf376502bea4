"""Static discovery: the workers given with ``--worker [MODEL=]URL`` (more can be added at run
time through ``POST /workers``)."""

from __future__ import annotations

from collections.abc import Iterable

from tpuserve_router.engines.workers import WorkerSpec, parse_worker_flag


def static_workers(flags: Iterable[str]) -> list[WorkerSpec]:
    """One `WorkerSpec` per ``--worker`` value, in order, without duplicates."""
    seen: set[str] = set()
    specs = []
    for flag in flags:
        if flag not in seen:
            seen.add(flag)
            specs.append(parse_worker_flag(flag))
    return specs
