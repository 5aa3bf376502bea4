"""Size a server from an SLO and a demand, analytically: which slice, how many replicas.

`tpuserve plan` sizes by simulating the fleet (`tpuserve.fleet`: minutes of CPU). This is the
fast answer (milliseconds a slice) that the operator runs for a ``TPUModelServer`` that states
``spec.slo`` and ``spec.demand`` instead of a slice, and that ``tpuserve plan --fit`` prints.
It reads only the performance model (`perf_model.StepTimer`, the calibrated step times) and
the catalog, so the operator can run it (the fleet model imports the router's policies; the
operator may not).

One replica at a decode concurrency ``B`` (requests generating at once), for the demand's
mean prompt ``P`` (a share ``reuse`` of it cached), mean output ``O``:

- a decode step of ``B`` sequences holding ``P + O/2`` tokens each takes ``d(B)``
  (`StepTimer.decode_step_seconds`); one prompt's prefill of its ``U = P (1 - reuse)``
  uncached tokens takes ``t_p`` (`StepTimer.prefill_seconds`);
- chunked prefill shares the steps: at ``lambda`` requests per second a share
  ``rho = lambda t_p`` of the time prefills, so a request's mean time between tokens is
  ``ITL = d(B) / (1 - rho)``;
- Little's law over the decoding requests, ``B = lambda (O - 1) ITL``, gives the rate in
  closed form: ``lambda = B / ((O - 1) d(B) + B t_p)``;
- a request first waits for one of the ``c`` running slots (``max_running_requests``, or
  fewer when the KV pool holds fewer ``P + O``-token requests), each held for its decode,
  ``(O - 1) ITL``: an M/M/c queue at offered load ``B``, whose wait exceeds ``t`` with
  probability ``C(c, B) exp(-(c - B) t / hold)`` (Erlang's C); then for prefill, as in an
  M/M/1 queue of service ``t_p`` at load ``rho`` (wait beyond ``t``:
  ``rho exp(-(1 - rho) t / t_p)``); a TTFT quantile is the sum of the two waits' quantiles
  ``+ t_p + d(B)`` (the sum over-states it a little).

The operating point is the ``B < c`` with the highest rate whose TTFT and ITL quantiles meet
the SLO; its concurrency
is every request in the replica (waiting, prefilling, decoding): ``lambda x`` the mean
latency. Replicas for the peak: ``ceil(rate / lambda)``; the trough's: that x ``trough``.
Slices are ranked by tokens per second per chip at the operating point, then the fewest
chips for the peak (no price needed; `tpuserve plan` ranks by price when every candidate
has one).

It is a model of means: it carries the performance model's error (`PERF_MODEL_ERROR`) and
its own against the fleet model's simulated percentiles (docs/capacity-planning.md, "The
fit check"). Its TTFT p99 is held against the engine twin's below, at and past the operating
point (`at_rate`, ``bench/plan_ttft_vs_twin.py``): `TTFT_P99_ERROR` is the twin's over the
model's at the point. Near the slots' cliff a slot frees at the pace of a full batch, which
the M/M/c wait at the mean batch leaves out: it under-states the wait below the point and
over-states it past it (infinite from the last slot), crossing the twin near the point. For
long prompts the twin's capacity is below the model's (its prefill steps do not decode).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_tpu.perf_model import (
    ModelDoesNotFit,
    ModelProfile,
    StepTimer,
    check_fits,
    kv_pool_tokens,
)
from sglang_tpu.topology import SliceShape

PERF_MODEL_ERROR = {"median": 0.11, "worst": 0.59, "rows": 33}
"""The performance model's |error| over the published TPU serving figures it is validated on
(``bench/perf_model_validation.py``; a unit test recomputes it)."""
TTFT_P99_ERROR = {"low": 0.06, "high": 16.58, "cases": 3}
"""The engine twin's TTFT p99 over the model's at the operating point (measured / predicted),
lowest and highest over the workloads of ``bench/plan_ttft_vs_twin.py`` (a unit test
recomputes it from the committed results). Wide, and not on the safe side for long prompts:
docs/capacity-planning.md, "Its percentiles against the twin"."""
MAX_RUNNING_REQUESTS = 256
"""SGLang's default ``--max-running-requests`` on these slices (the fleet model's too)."""


class SizingError(ValueError):
    """A bad input: the message names the field, the value and what is allowed."""


@dataclass(frozen=True)
class Demand:
    """Requests per second at the daily peak and their mean shape."""

    requests_per_second: float
    prompt_tokens: int
    output_tokens: int
    prefix_reuse: float = 0.0
    """Share of each prompt found cached (a shared system prompt, earlier turns)."""
    trough: float = 0.35
    """The daily low as a share of the peak: the lower replica bound's share."""

    def validate(self, where: str = "demand") -> None:
        if not 0 < self.requests_per_second < math.inf:
            raise SizingError(f"{where}.requestsPerSecond: {self.requests_per_second!r} is not "
                              "allowed; allowed: > 0")  # fmt: skip
        for name, value in (("promptTokens", self.prompt_tokens),
                            ("outputTokens", self.output_tokens)):  # fmt: skip
            if value < 1:
                raise SizingError(f"{where}.{name}: {value!r} is not allowed; allowed: >= 1")
        if not 0 <= self.prefix_reuse < 1:
            raise SizingError(f"{where}.prefixReuse: {self.prefix_reuse!r} is not allowed; "
                              "allowed: 0 <= share < 1")  # fmt: skip
        if not 0 <= self.trough <= 1:
            raise SizingError(f"{where}.trough: {self.trough!r} is not allowed; allowed: 0..1")


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds: TTFT and ITL (each request's mean time between output
    tokens) at p99, optionally at p50."""

    ttft_p99: float
    itl_p99: float
    ttft_p50: float | None = None
    itl_p50: float | None = None


@dataclass(frozen=True)
class OperatingPoint:
    """One replica at the highest load that meets the SLO."""

    requests_per_second: float
    concurrency: float
    """Requests in the replica on average (waiting, prefilling, decoding)."""
    decode_batch: int
    """Requests generating at once (``B``)."""
    ttft_p50: float
    ttft_p99: float
    itl: float
    tokens_per_second_per_chip: float
    output_tokens_per_second_per_chip: float


@dataclass(frozen=True)
class SliceSize:
    shape: SliceShape
    why_not: str = ""
    """Empty when the slice serves the demand within the SLO."""
    point: OperatingPoint | None = None
    replicas: int = 0
    """Replicas for the peak."""
    min_replicas: int = 0
    """Replicas for the trough (at least 1)."""

    @property
    def fits(self) -> bool:
        return self.point is not None and not self.why_not

    @property
    def chips(self) -> int:
        return self.replicas * self.shape.chips


def _quantile_wait(rho: float, service: float, q: float) -> float:
    """The ``q`` quantile of an M/M/1 queue's wait at load ``rho``, service ``service``."""
    tail = 1.0 - q
    if rho <= tail:
        return 0.0
    return service / (1.0 - rho) * math.log(rho / tail)


def _erlang_c(servers: int, load: float) -> float:
    """The probability an arrival waits in an M/M/c queue of ``servers`` at offered ``load``
    (< servers): Erlang's C, from the Erlang B recursion (stable for hundreds of servers)."""
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return servers * b / (servers - load * (1.0 - b))


def _slot_wait(servers: int, load: float, waits: float, hold: float, q: float) -> float:
    """The ``q`` quantile of the wait for a free slot among ``servers`` held ``hold`` seconds
    each at offered ``load`` (M/M/c), ``waits`` being Erlang's C:
    ``P(wait > t) = C exp(-(c - load) t / hold)``."""
    tail = 1.0 - q
    if waits <= tail:
        return 0.0
    return hold / (servers - load) * math.log(waits / tail)


def _slots(pool_tokens: int, demand: Demand) -> int:
    """The running slots ``c``: SGLang's limit, or fewer when the KV pool holds fewer
    ``P + O``-token requests."""
    return min(MAX_RUNNING_REQUESTS, pool_tokens // (demand.prompt_tokens + demand.output_tokens))


def _at_batch(
    timer: StepTimer, demand: Demand, t_p: float, most: int, b: int, rate: float | None
) -> tuple[float, float, float, float, float] | None:
    """One replica at decode batch ``b``: (rate, TTFT p50, TTFT p99, ITL, mean latency), at
    the rate ``b`` implies (Little's law) or at ``rate`` given (the load offered the slots is
    then ``rate`` x the hold, as measured); None past prefill's saturation."""
    output = demand.output_tokens
    d = timer.decode_step_seconds(b, int(b * (demand.prompt_tokens + output / 2.0)))
    implied = b / ((output - 1) * d + b * t_p)
    rate = implied if rate is None else rate
    rho = rate * t_p
    if rho >= 1.0:
        return None
    itl = d / (1.0 - rho)
    hold = max((output - 1) * itl, t_p)  # a slot's time: its decode (b = rate x hold)
    slots = max(most, b + 1)
    offered = rate * hold
    if offered >= slots:
        return rate, math.inf, math.inf, itl, math.inf
    waits = _erlang_c(slots, offered)
    p99 = _quantile_wait(rho, t_p, 0.99) + _slot_wait(slots, offered, waits, hold, 0.99)
    p50 = _quantile_wait(rho, t_p, 0.5) + _slot_wait(slots, offered, waits, hold, 0.5)
    mean_wait = rho / (1.0 - rho) * t_p + waits * hold / (slots - offered)
    latency = mean_wait + t_p + d + (output - 1) * itl
    return rate, p50 + t_p + d, p99 + t_p + d, itl, latency


@dataclass(frozen=True)
class Load:
    """The model's latencies of one replica at a given request rate (`at_rate`)."""

    requests_per_second: float
    decode_batch: int
    ttft_p50: float
    ttft_p99: float
    """``math.inf`` at or past the slot limit (the model's cliff)."""
    itl: float


def at_rate(timer: StepTimer, pool_tokens: int, demand: Demand, rate: float) -> Load:
    """What the model predicts for one replica offered ``rate`` requests per second (below,
    at or past its operating point): the decode batch is the smallest whose Little's-law rate
    reaches ``rate``; past the last slot, or with prefill saturated, the TTFT is infinite.
    This is what `bench/plan_ttft_vs_twin.py` holds against the engine twin."""
    if not 0 < rate < math.inf:
        raise SizingError(f"rate: {rate!r} is not allowed; allowed: > 0")
    prompt, output = demand.prompt_tokens, demand.output_tokens
    uncached = max(1, round(prompt * (1.0 - demand.prefix_reuse)))
    t_p = timer.prefill_seconds(uncached, prompt - uncached)
    most = _slots(pool_tokens, demand)
    for b in range(1, max(most, 1) + 1):
        d = timer.decode_step_seconds(b, int(b * (prompt + output / 2.0)))
        if b / ((output - 1) * d + b * t_p) >= rate:
            at = _at_batch(timer, demand, t_p, most, b, rate)
            if at is not None:
                return Load(rate, b, at[1], at[2], at[3])
            break
    return Load(rate, max(most, 1), math.inf, math.inf, math.inf)


def operating_point(
    timer: StepTimer, pool_tokens: int, demand: Demand, slo: Slo, chips: int
) -> tuple[OperatingPoint | None, str]:
    """The highest-rate point of one replica meeting ``slo``, or (None, why not)."""
    prompt, output = demand.prompt_tokens, demand.output_tokens
    uncached = max(1, round(prompt * (1.0 - demand.prefix_reuse)))
    t_p = timer.prefill_seconds(uncached, prompt - uncached)
    per_request_kv = prompt + output
    most = _slots(pool_tokens, demand)
    if most < 1:
        return None, (f"one request ({per_request_kv} tokens of KV) does not fit the "
                      f"{pool_tokens}-token KV pool")  # fmt: skip
    best: OperatingPoint | None = None
    why = ""
    for b in range(1, most if most > 1 else 2):
        at = _at_batch(timer, demand, t_p, most, b, None)
        if at is None:
            break
        rate, ttft_p50, ttft_p99, itl, latency = at
        checks = (("TTFT p99", ttft_p99, slo.ttft_p99), ("ITL p99", itl, slo.itl_p99),
                  ("TTFT p50", ttft_p50, slo.ttft_p50), ("ITL p50", itl, slo.itl_p50))  # fmt: skip
        missed = [(n, v, t) for n, v, t in checks if t is not None and v > t]
        if missed:
            if best is None:
                n, v, t = missed[0]
                why = f"{n} {v:.3g} s > {t:g} s even at one request at a time"
            continue
        if best is not None and rate <= best.requests_per_second:
            continue
        best = OperatingPoint(
            requests_per_second=rate,
            concurrency=rate * latency,
            decode_batch=b,
            ttft_p50=ttft_p50,
            ttft_p99=ttft_p99,
            itl=itl,
            tokens_per_second_per_chip=rate * (prompt + output) / chips,
            output_tokens_per_second_per_chip=rate * output / chips,
        )
    return best, ("" if best is not None else why or "no load meets the SLO")


def size_slice(
    shape: SliceShape,
    profile: ModelProfile,
    demand: Demand,
    slo: Slo,
    *,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
    context_length: int | None = None,
) -> SliceSize:
    """One slice: does the model fit, its operating point, replicas for the peak."""
    context = context_length or min(profile.context_length,
                                    demand.prompt_tokens + demand.output_tokens)  # fmt: skip
    try:
        check_fits(shape, profile, quantization, kv_cache_dtype, context)
    except ModelDoesNotFit as err:
        return SliceSize(shape, why_not=str(err).split(";")[0])
    timer = StepTimer(shape, profile, quantization, kv_cache_dtype)
    pool = kv_pool_tokens(shape, profile, quantization, kv_cache_dtype)
    point, why = operating_point(timer, pool, demand, slo, shape.chips)
    if point is None:
        return SliceSize(shape, why_not=why)
    replicas = math.ceil(demand.requests_per_second / point.requests_per_second - 1e-9)
    low = max(1, math.ceil(replicas * demand.trough - 1e-9))
    return SliceSize(shape, point=point, replicas=replicas, min_replicas=min(low, replicas))


def rank(sizes: Sequence[SliceSize]) -> list[SliceSize]:
    """The slices that serve the demand, best first: tokens per second per chip at the
    operating point (highest first), then the fewest chips for the peak."""
    usable = [s for s in sizes if s.fits and s.point is not None]
    return sorted(
        usable,
        key=lambda s: (-s.point.tokens_per_second_per_chip if s.point else 0.0, s.chips),
    )


def size(
    shapes: Sequence[SliceShape],
    profile: ModelProfile,
    demand: Demand,
    slo: Slo,
    *,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
    context_length: int | None = None,
) -> list[SliceSize]:
    """Every slice of ``shapes`` sized, in the order given (`rank` orders them)."""
    demand.validate()
    return [
        size_slice(
            shape,
            profile,
            demand,
            slo,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            context_length=context_length,
        )
        for shape in shapes
    ]
