"""Static discovery: the workers given with ``--worker URL`` (more can be added at run time
through ``POST /workers``)."""

from __future__ import annotations

from collections.abc import Iterable

from tpuserve_router.workers import WorkerSpec


def static_workers(urls: Iterable[str]) -> list[WorkerSpec]:
    """One `WorkerSpec` per URL, in order, without duplicates."""
    seen: set[str] = set()
    specs = []
    for url in urls:
        if url not in seen:
            seen.add(url)
            specs.append(WorkerSpec(url))
    return specs
