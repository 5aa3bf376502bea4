"""Replay a load trace through the router at a fixed rate, streaming, and keep statistics.

Every request streams with usage included, so the driver sees time to first token, output
tokens and cached prompt tokens (the prefix hit rate) exactly as a client would. Rates and
percentiles are over the last `WINDOW_SECONDS`; counts are since the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuserve.up.errors import UpError
from tpuserve.up.loads import LoadRequest

WINDOW_SECONDS = 10.0  # rates and percentiles shown over this trailing window


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """What the live table and the ``--json`` load lines show, at one moment."""

    elapsed_seconds: float
    requests_per_second: float
    output_tokens_per_second: float
    prefix_hit_rate: float
    """Cached / prompt tokens since the start, from the responses' usage (0 before any)."""
    ttft_p50_seconds: float | None
    ttft_p99_seconds: float | None
    in_flight: int
    sent: int
    done: int
    failed: int
    last_error: str


@dataclass
class LoadStats:
    """Counters the driver updates as requests finish; `snapshot()` reads them."""

    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    last_error: str = ""
    recent: deque[tuple[float, float | None, int]] = field(
        default_factory=lambda: deque(maxlen=20_000)
    )
    """(finish time, TTFT seconds or None, output tokens) of recent requests."""

    def window(self) -> tuple[float, float, list[float]]:
        now = time.monotonic()
        span = min(WINDOW_SECONDS, max(now - self.started, 1e-9))
        cutoff = now - span
        rows = [r for r in self.recent if r[0] >= cutoff]
        ttfts = sorted(r[1] for r in rows if r[1] is not None)
        return len(rows) / span, sum(r[2] for r in rows) / span, ttfts

    def snapshot(self) -> LoadSnapshot:
        rps, tps, ttfts = self.window()
        return LoadSnapshot(
            elapsed_seconds=time.monotonic() - self.started,
            requests_per_second=rps,
            output_tokens_per_second=tps,
            prefix_hit_rate=self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            ttft_p50_seconds=percentile(ttfts, 0.5),
            ttft_p99_seconds=percentile(ttfts, 0.99),
            in_flight=self.in_flight,
            sent=self.sent,
            done=self.done,
            failed=self.failed,
            last_error=self.last_error,
        )


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def drive(
    base_url: str,
    model: str,
    trace: Sequence[LoadRequest],
    rate: float,
    stats: LoadStats,
    max_requests: int | None,
    stop: asyncio.Event,
) -> None:
    """Replay ``trace`` (in a loop) at ``rate`` requests/s, streaming every request."""
    import aiohttp

    if not trace:
        raise UpError("--load: the trace is empty")
    span = trace[-1].t - trace[0].t
    scale = ((len(trace) - 1) / span) / rate if span > 0 and len(trace) > 1 else 1.0 / rate
    connector = aiohttp.TCPConnector(limit=0)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(
        base_url, connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        offset = 0.0
        while not stop.is_set():
            for item in trace:
                if stop.is_set() or (max_requests is not None and stats.sent >= max_requests):
                    break
                due = start + offset + (item.t - trace[0].t) * scale
                delay = due - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                stats.sent += 1
                task = asyncio.ensure_future(_one(session, model, item, stats))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                offset += span * scale + 1.0 / rate
                continue
            break
        if tasks and not stop.is_set():
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _one(session: Any, model: str, item: LoadRequest, stats: LoadStats) -> None:
    import orjson

    route, body = item.body()
    body.update(model=model, stream=True, stream_options={"include_usage": True})
    stats.in_flight += 1
    began = time.monotonic()
    ttft: float | None = None
    usage: dict[str, Any] | None = None
    try:
        async with session.post(route, json=body) as response:
            if response.status != 200:
                stats.failed += 1
                stats.last_error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if ttft is None:
                    ttft = time.monotonic() - began
                if b'"usage"' in line:
                    event = orjson.loads(line[6:])
                    if event.get("usage"):
                        usage = event["usage"]
                    elif event.get("error"):
                        stats.failed += 1
                        stats.last_error = str(event["error"].get("message"))[:200]
                        return
        stats.done += 1
        output = 0
        if usage:
            output = int(usage.get("completion_tokens") or 0)
            stats.output_tokens += output
            stats.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            stats.cached_tokens += int(details.get("cached_tokens") or 0)
        stats.recent.append((time.monotonic(), ttft, output))
    except Exception as err:
        stats.failed += 1
        stats.last_error = f"{type(err).__name__}: {err}"[:200]
    finally:
        stats.in_flight -= 1
