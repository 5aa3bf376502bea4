"""Turn per-request records into the benchmark's summary (the object ``--json`` prints).

Definitions (reference router.md §7.7):

- latencies are measured from arrival; TTFT to the first token, E2E to the last;
  TPOT = ``(E2E - TTFT) / (output tokens - 1)``;
- the first ``warmup_fraction`` of requests (by arrival) are not measured;
- ``hit_rate`` = sum of ``cached_tokens`` / sum of prompt tokens, as the engines report them;
  ``host_hit_rate`` the share of prompt tokens of those loaded back from a host tier (so
  ``hit_rate - host_hit_rate`` was found in HBM);
- throughput and goodput divide by the measured span: first measured arrival to last finish;
- a request is *good* when it succeeded, its TTFT is within ``slo_factor`` x its unloaded,
  uncached TTFT on one engine (prefill of the whole prompt alone) and its TPOT within
  ``slo_factor`` x one unloaded decode step (``goodput_rps``: 5 x; ``goodput_rps_strict``:
  2 x, the two SLOs DualMap's methodology uses);
- a request that did not succeed is *failed*; ``failed_by_reason`` counts the failed ones by
  the reason their record carries (a record never fails without one: `failure_reason`);
- ``imbalance_max_over_mean``: each worker's in-flight count is sampled every 0.1 s over the
  measured window; max over workers of the time-averaged count / mean over workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SLO_FACTOR = 5.0
STRICT_SLO_FACTOR = 2.0


@dataclass(slots=True)
class RequestRecord:
    id: str
    worker: str
    arrival: float
    prompt_tokens: int
    outcome: str = ""
    ttft: float | None = None
    e2e: float | None = None
    cached_tokens: int = 0
    completion_tokens: int = 0
    ok: bool = False
    error: str = ""
    """Why the request failed (empty while it has not): a short code such as ``http_503``."""
    error_detail: str = ""
    """More about the failure (the engine's or router's message), when there is more."""
    ttft_slo: float = math.inf
    tpot_slo: float = math.inf
    cached_host_tokens: int = 0
    """Of ``cached_tokens``, those the engine loaded back from its host tier."""

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    @property
    def succeeded(self) -> bool:
        return self.ok and self.ttft is not None and self.e2e is not None

    @property
    def failure_reason(self) -> str:
        """Empty for a request that succeeded, else why it failed (``unknown`` only if a
        runner forgot to say, which the runners' tests rule out)."""
        return "" if self.succeeded else (self.error or "unknown")

    @property
    def good(self) -> bool:
        return self.good_at(1.0)

    def good_at(self, scale: float) -> bool:
        """Met both SLOs, each multiplied by `scale`."""
        if not self.ok or self.ttft is None or self.ttft > self.ttft_slo * scale:
            return False
        tpot = self.tpot
        return tpot is None or tpot <= self.tpot_slo * scale


@dataclass
class LoadSamples:
    """Per-worker in-flight counts sampled at a fixed interval."""

    workers: list[str]
    times: list[float] = field(default_factory=list)
    loads: list[list[int]] = field(default_factory=list)

    def add(self, t: float, loads: list[int]) -> None:
        self.times.append(t)
        self.loads.append(loads)

    def imbalance(self, start: float, end: float) -> tuple[float, float]:
        """(max/mean of time-averaged loads, mean coefficient of variation) over [start, end]."""
        rows = [row for t, row in zip(self.times, self.loads, strict=True) if start <= t <= end]
        if not rows or not self.workers:
            return 1.0, 0.0
        n = len(self.workers)
        avg = [sum(r[i] for r in rows) / len(rows) for i in range(n)]
        mean = sum(avg) / n
        ratio = max(avg) / mean if mean > 0 else 1.0
        cvs = []
        for r in rows:
            m = sum(r) / n
            if m > 0:
                cvs.append(math.sqrt(sum((x - m) ** 2 for x in r) / n) / m)
        return ratio, (sum(cvs) / len(cvs) if cvs else 0.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo = math.floor(k)
    hi = math.ceil(k)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def measured(records: Sequence[RequestRecord], warmup_fraction: float) -> list[RequestRecord]:
    ordered = sorted(records, key=lambda r: r.arrival)
    skip = int(len(ordered) * warmup_fraction)
    return ordered[skip:]


def summarize(
    policy: str,
    records: Sequence[RequestRecord],
    samples: LoadSamples | None,
    *,
    warmup_fraction: float = 0.1,
    time_unit: float = 1.0,
    slo_factor: float = SLO_FACTOR,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary object; times are divided by `time_unit` (live runs undo time dilation)."""
    rows = measured(records, warmup_fraction)
    done = [r for r in rows if r.succeeded]
    ttft = [r.ttft / time_unit for r in done if r.ttft is not None]
    e2e = [r.e2e / time_unit for r in done if r.e2e is not None]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    cached_host = sum(r.cached_host_tokens for r in done)
    start = rows[0].arrival if rows else 0.0
    end = max((r.arrival + (r.e2e or 0.0) for r in done), default=start)
    span = (end - start) / time_unit
    last_arrival = rows[-1].arrival if rows else start
    ratio, cv = samples.imbalance(start, last_arrival) if samples is not None else (1.0, 0.0)
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    per_worker: dict[str, int] = {}
    for r in rows:
        per_worker[r.worker] = per_worker.get(r.worker, 0) + 1
    failed_by_reason: dict[str, int] = {}
    for r in rows:
        if reason := r.failure_reason:
            failed_by_reason[reason] = failed_by_reason.get(reason, 0) + 1
    good = sum(1 for r in rows if r.good)
    strict = sum(1 for r in rows if r.good_at(STRICT_SLO_FACTOR / slo_factor))

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    summary: dict[str, Any] = {
        "policy": policy,
        "requests": len(rows),
        "succeeded": len(done),
        "failed": len(rows) - len(done),
        "failed_by_reason": dict(sorted(failed_by_reason.items())),
        "hit_rate": cached / prompt if prompt else 0.0,
        "host_hit_rate": cached_host / prompt if prompt else 0.0,
        "ttft_mean": mean(ttft),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p90": percentile(ttft, 90),
        "ttft_p99": percentile(ttft, 99),
        "e2e_mean": mean(e2e),
        "e2e_p50": percentile(e2e, 50),
        "e2e_p99": percentile(e2e, 99),
        "tpot_mean": mean([t / time_unit for r in done if (t := r.tpot) is not None]),
        "throughput_rps": len(done) / span if span > 0 else 0.0,
        "output_tokens_per_s": sum(r.completion_tokens for r in done) / span if span > 0 else 0.0,
        "goodput_rps": good / span if span > 0 else 0.0,
        "goodput_rps_strict": strict / span if span > 0 else 0.0,
        "good_fraction": good / len(rows) if rows else 0.0,
        "imbalance_max_over_mean": ratio,
        "imbalance_cv": cv,
        "outcomes": outcomes,
        "requests_per_worker": per_worker,
    }
    if extra:
        summary.update(extra)
    return summary


def recovery_seconds(
    records: Sequence[RequestRecord],
    fault_at: float,
    *,
    worker: str | None = None,
    pre_fault_at: float | None = None,
    window_seconds: float = 10.0,
    step_seconds: float = 0.25,
    level: float = 0.9,
) -> dict[str, float | None]:
    """Seconds after `fault_at` until the hit rate of requests arriving in a trailing 1 s
    window is back to `level` x its value over the `window_seconds` before `pre_fault_at`
    (default `fault_at`); None if it never recovers within the run."""

    def rate(lo: float, hi: float) -> float | None:
        c = p = 0
        for r in records:
            if r.ok and lo <= r.arrival < hi and (worker is None or r.worker == worker):
                c += r.cached_tokens
                p += r.prompt_tokens
        return c / p if p else None

    pre = fault_at if pre_fault_at is None else pre_fault_at
    before = rate(pre - window_seconds, pre)
    if before is None:
        return {"pre_fault_hit_rate": None, "recovery_seconds": None}
    end = max((r.arrival for r in records), default=fault_at)
    short = 1.0  # the recovering rate is read over a 1 s trailing window
    t = fault_at + step_seconds
    while t <= end:
        now = rate(max(fault_at, t - short), t)
        if now is not None and now >= level * before:
            return {"pre_fault_hit_rate": before, "recovery_seconds": t - fault_at}
        t += step_seconds
    return {"pre_fault_hit_rate": before, "recovery_seconds": None}
