"""Goodput at the SLO as a rate: the highest arrival rate whose requests still meet it.

`tpuserve bench` replays a trace at one rate and counts the requests that met the SLO
(`report.summarize`: ``goodput_rps``). At a rate every setup sustains, that count is the
offered rate for all of them, so a faster fleet cannot show it is faster. The serving
literature's goodput (DistServe, OSDI '24; DualMap) is instead the highest request rate at
which a stated share of requests (the *attainment*, 90 % by default) meets the SLO. This
module finds it: the same trace (same seed, same arrivals up to scale) is replayed at
rising rates, x ``growth`` from ``start``, until attainment fails, then the rate is bisected
between the last rate that met it and the first that did not, to ``tolerance`` (relative).
The search assumes attainment falls as the rate rises; every rate tried is returned, so a
non-monotone curve shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ATTAINMENT = 0.9
"""Share of measured requests within the SLO (DistServe's 90 %)."""


@dataclass(slots=True)
class SloSearch:
    attainment: float
    max_rate: float
    """The highest rate tried that met ``attainment`` (0 when none did)."""
    best: dict[str, Any] | None
    """The summary of the run at ``max_rate``."""
    tried: list[dict[str, Any]] = field(default_factory=list)
    """Every rate tried, in order: rate, good_fraction, goodput_rps, ttft_p50, ttft_p99."""

    def record(self, slo_factor: float, start: float) -> dict[str, Any]:
        """The search as a result's ``slo_search`` field (`tpuserve bench --max-rate-at-slo
        --json`)."""
        return {
            "attainment": self.attainment, "slo_factor": slo_factor, "max_rate": self.max_rate,
            "goodput_rps": self.best["goodput_rps"] if self.best is not None else 0.0,
            "start_rate": start, "tried": self.tried,
        }  # fmt: skip


def search_max_rate(
    run_at: Callable[[float], dict[str, Any]],
    start: float,
    *,
    attainment: float = DEFAULT_ATTAINMENT,
    growth: float = 1.25,
    tolerance: float = 0.01,
    max_runs: int = 40,
) -> SloSearch:
    """``run_at(rate)`` returns a `report.summarize` summary (``good_fraction`` is read);
    ``start`` is the first rate tried (> 0)."""
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment: {attainment!r} is not allowed; allowed: 0 < a <= 1")
    if start <= 0:
        raise ValueError(f"start: {start!r} is not allowed; allowed: a rate > 0")
    if growth <= 1 or tolerance <= 0:
        raise ValueError(f"growth {growth!r}, tolerance {tolerance!r}: need growth > 1, tol > 0")
    out = SloSearch(attainment, 0.0, None)

    def meets(rate: float) -> bool:
        summary = run_at(rate)
        ok = bool(summary["good_fraction"] >= attainment)
        out.tried.append({
            "rate": rate, "good_fraction": summary["good_fraction"],
            "goodput_rps": summary["goodput_rps"], "ttft_p50": summary["ttft_p50"],
            "ttft_p99": summary["ttft_p99"], "meets": ok,
        })  # fmt: skip
        if ok and rate > out.max_rate:
            out.max_rate, out.best = rate, summary
        return ok

    lo, hi = 0.0, start
    while meets(hi):  # grow until a rate fails
        lo, hi = hi, hi * growth
        if len(out.tried) >= max_runs:
            return out
    if lo == 0.0:  # the first rate failed: shrink until one meets it
        while len(out.tried) < max_runs:
            hi, lo = hi, hi / growth
            if meets(lo):
                break
            hi = lo
        else:
            return out
    while hi / lo - 1 > tolerance and len(out.tried) < max_runs:
        mid = (lo * hi) ** 0.5
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return out
