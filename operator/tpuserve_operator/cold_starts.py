"""What the leaders report of their cold starts, gathered into `status.compileCache`.

How the operator learns it: once a leader pod is Ready, the operator reads it once (per pod
start: uid and restart count) from the engine's ``/server_info``, whose ``tpuserve`` block
carries the cold start (`sglang_tpu.cold_start.ColdStartReport`). Engine pods need no API
rights for this (no annotations or Events written from the pod, which runs model code), and
the operator needs none beyond reading pods; the engines' NetworkPolicy lets the operator's
pods reach the HTTP port. A real SGLang engine has no such block: the status then shows the
key and location only (the launcher logs the cache result and the weights phase).

The counts live in the status (they survive operator restarts); the starts already counted
live in `ServerState`. After an operator restart the leaders already Ready in a fresh pod
list (not the watch cache, which may not have caught up) are taken as counted (their starts
were, by the operator before), so nothing is counted twice.

The read is bounded: `READ_DEADLINE_SECONDS` in all, at most `MAX_REPORT_BYTES`, no proxy
and no redirect (an engine pod runs model code; it must not steer the operator elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_tpu import compile_cache
from sglang_tpu.cold_start import ColdStartReport
from sglang_tpu.contract.group_contract import GroupContract
from tpuserve_operator import labels
from tpuserve_operator.api import ColdStartStatus, CompileCacheSpec, CompileCacheStatus
from tpuserve_operator.observed import PodView

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 2.0  # per socket operation
READ_DEADLINE_SECONDS = 5.0  # the whole read
MAX_REPORT_BYTES = 64 * 1024
ReportReader = Callable[[str], Awaitable[ColdStartReport | None]]
"""Reads one leader's report from its base URL (None when it has none)."""
PodLister = Callable[[], Awaitable[list[PodView] | None]]
"""Lists a server's pods from the API (None when it cannot)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect (a 3xx is an error, hence no report)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


@dataclass(frozen=True, slots=True)
class LeaderStart:
    pod: str
    report: ColdStartReport


def start_id(pod: PodView) -> str:
    """One start of one pod: a restarted container is a new start."""
    return f"{pod.uid}/{pod.restarts}"


def cache_location(cache: CompileCacheSpec | None) -> str:
    """Where the cache is, as the status shows it: pvc/<claim>, the gs:// prefix, or ""."""
    if cache is None:
        return ""
    return (
        f"pvc/{cache.persistent_volume_claim}" if cache.persistent_volume_claim else cache.gcs or ""
    )


def compile_cache_status(
    previous: CompileCacheStatus | None,
    contract: GroupContract,
    location: str,
    starts: Sequence[LeaderStart],
) -> CompileCacheStatus:
    """`previous` with the key and location of this spec and `starts` counted in.

    A new key (another model, slice or engine) starts its counts from zero.
    """
    key = compile_cache.cache_key(contract)
    same_key = previous is not None and previous.key == key
    hits = previous.hits if previous is not None and same_key else 0
    misses = previous.misses if previous is not None and same_key else 0
    last = previous.last_cold_start if previous is not None and same_key else None
    for start in starts:
        report = start.report
        if report.cache_result == "hit":
            hits += 1
        else:
            misses += 1
        last = ColdStartStatus(
            pod=start.pod,
            cache_result=report.cache_result,
            pull_seconds=report.seconds["pull"],
            weights_seconds=report.seconds["weights"],
            compile_seconds=report.seconds["compile"],
            warmup_seconds=report.seconds["warmup"],
        )
    return CompileCacheStatus(
        key=key, location=location, hits=hits, misses=misses, last_cold_start=last
    )


def ready_leaders(pods: Iterable[PodView]) -> list[PodView]:
    return [p for p in pods if p.role == labels.ROLE_LEADER and p.ready and p.ip]


async def read_server_info(base_url: str) -> ColdStartReport | None:
    """The cold start in a leader's ``/server_info`` (None without one, or unreachable)."""

    def fetch() -> bytes:
        with _OPENER.open(f"{base_url}/server_info", timeout=READ_TIMEOUT_SECONDS) as r:
            body: bytes = r.read(MAX_REPORT_BYTES + 1)
        if len(body) > MAX_REPORT_BYTES:
            raise ValueError(f"/server_info is larger than {MAX_REPORT_BYTES} bytes")
        return body

    try:
        body = await asyncio.wait_for(asyncio.to_thread(fetch), READ_DEADLINE_SECONDS)
        info = json.loads(body)
        block = (info.get("tpuserve") or {}).get("cold_start")
        return ColdStartReport.from_json(block) if block else None
    except (OSError, ValueError, AttributeError) as err:
        log.debug("no cold-start report from %s: %s", base_url, err)
        return None


class ColdStartTracker:
    """The starts of one server's leaders already counted; reads each new one once."""

    def __init__(self) -> None:
        self.counted: set[str] | None = None  # None: nothing seen since the operator started

    async def new_starts(
        self, pods: Iterable[PodView], port: int, read: ReportReader, listed: PodLister
    ) -> list[LeaderStart]:
        """The starts of `pods` (the watch cache) not read yet; the first call takes the
        leaders Ready in a fresh list (`listed`) as counted."""
        if self.counted is None:  # the operator (re)started: these were counted before
            existing = await listed()
            if existing is not None:
                self.counted = {start_id(p) for p in ready_leaders(existing)}
            return []
        found = []
        for pod in ready_leaders(pods):
            if start_id(pod) in self.counted:
                continue
            report = await read(f"http://{pod.ip}:{port}")
            self.counted.add(start_id(pod))  # read once, with or without a report
            if report is not None:
                found.append(LeaderStart(pod.name, report))
        return found
