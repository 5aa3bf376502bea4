"""The capacity planner behind `tpuserve plan`: which slice, how many replicas, at what cost.

For every allowed (generation, topology) of the catalog where the model fits
(`perf_model.check_fits` at the plan's context length), the planner finds the largest load one
replica serves within the SLOs **by running the fleet model** (`tpuserve.fleet`):
``sim_replicas`` replicas behind tpuserve's default policy at a constant rate for a short
window, the rate per replica found by doubling then bisection (Vidur-Search's approach,
reference capacity-planning.md §3.1). Tensor parallelism is the slice's: one engine per slice,
TP over all its devices (the project's launch contract), so searching topologies searches TP.
The fleet model serves prefill and decode colocated. With ``--disaggregate`` the chosen
replicas are also split between a prefill and a decode role (`disaggregate`): the
performance model's need per role over a sample of the workload's requests at the peak
(`tpuserve.bench.pd_split`, the PD benchmark's split), not a simulation against the SLOs.

The replica count for the peak is ``ceil(peak_rate / capacity)``; cost per million output
tokens is GKE Inference Quickstart's formula (gkerecommender v1 ``Cost``):

    $/output_token = accelerator_$/s / (input_tok_s / r + output_tok_s)

with ``r`` = ``output_input_cost_ratio`` (GIQ's default 4) and the throughputs one replica
reaches at its capacity; the accelerator price is the slice's chips x the price table's
chip-hour price for the pricing model. Candidates are ranked by it; the Pareto front keeps
those no other beats on both cost and p99 TTFT at capacity.

The error band is the performance model's, from its validation against published TPU serving
figures (`PERF_MODEL_ERROR`; docs/engine-sim.md): the step times under every simulated number
are that far from real engines' (median 11 %, worst 59 %), so a capacity is quoted with it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_tpu import disaggregation as pd
from sglang_tpu import hicache, model_config
from sglang_tpu.perf_model import (
    ModelDoesNotFit,
    ModelProfile,
    StepTimer,
    check_fits,
    get_profile,
    kv_pool_tokens,
)
from sglang_tpu.slo_sizing import PERF_MODEL_ERROR as PERF_MODEL_ERROR  # re-exported
from sglang_tpu.topology import SLICE_SHAPES, CatalogError, SliceShape, generation_names, lookup
from tpuserve.bench import pd_split
from tpuserve.fleet import BLOCK_TOKENS, FleetConfig, FleetResult, FleetSim, run_fleet

PRICES_FILE = Path(__file__).with_name("prices.json")
PRICING_MODELS = ("on-demand", "spot")
DEFAULT_OUTPUT_INPUT_COST_RATIO = 4.0
"""GIQ's ``output_input_cost_ratio`` default."""
DOUBLINGS = 14
BISECTIONS = 6
PD_SAMPLE_REQUESTS = 20_000
"""Requests of the peak the P:D split is computed over, at most (fewer: the window's)."""


class PlanError(ValueError):
    """A bad planner input: the message names the field, the value and what is allowed."""


def _bad(name: str, value: Any, allowed: str) -> PlanError:
    return PlanError(f"{name}: {value!r} is not allowed; allowed: {allowed}")


# ---------------------------------------------------------------------------------- prices


@dataclass(frozen=True)
class PriceTable:
    date: str
    source: str
    notes: str
    prices: Mapping[str, Mapping[str, float | None]]
    """generation -> pricing model -> USD per chip-hour (None: not known)."""

    def chip_hour(self, generation: str, pricing: str) -> float | None:
        return self.prices.get(generation, {}).get(pricing)


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The shipped price table, or the one at ``path`` (same format)."""
    where = str(path) if path is not None else "the shipped price table"
    try:
        data = json.loads(Path(path or PRICES_FILE).read_text())
    except OSError as err:
        raise PlanError(f"--prices: cannot read {where!r}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise PlanError(f"--prices: {where} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise PlanError(f"--prices: {where} must hold a JSON object")
    for key in ("date", "source", "prices"):
        if key not in data:
            raise PlanError(f"--prices: {where} has no {key!r}; allowed: date, source, prices")
    prices: dict[str, dict[str, float | None]] = {}
    raw = data["prices"]
    if not isinstance(raw, dict):
        raise PlanError(f"--prices: {where}: 'prices' must map generations to prices")
    for gen, entry in raw.items():
        if gen not in generation_names():
            raise _bad(f"--prices: {where}: prices", gen, ", ".join(generation_names()))
        if not isinstance(entry, dict):
            raise PlanError(f"--prices: {where}: prices.{gen} must be an object")
        row: dict[str, float | None] = {}
        for model, value in entry.items():
            if model not in PRICING_MODELS:
                raise _bad(f"--prices: {where}: prices.{gen}", model, ", ".join(PRICING_MODELS))
            ok = value is None or (isinstance(value, int | float) and 0 < value < math.inf)
            if not ok:
                raise _bad(f"--prices: {where}: prices.{gen}.{model}", value, "> 0 or null")
            row[model] = None if value is None else float(value)
        prices[gen] = row
    return PriceTable(str(data["date"]), str(data["source"]), str(data.get("notes", "")), prices)


def override_prices(table: PriceTable, overrides: Sequence[str]) -> PriceTable:
    """Apply ``GENERATION:MODEL=USD`` overrides (``v6e:spot=1.1``)."""
    prices = {g: dict(row) for g, row in table.prices.items()}
    for text in overrides:
        head, sep, value = text.partition("=")
        gen, sep2, model = head.partition(":")
        if not sep or not sep2:
            raise _bad("--price", text, "GENERATION:on-demand=USD or GENERATION:spot=USD")
        if gen not in generation_names():
            raise _bad("--price", gen, ", ".join(generation_names()))
        if model not in PRICING_MODELS:
            raise _bad("--price", model, ", ".join(PRICING_MODELS))
        try:
            usd = float(value)
        except ValueError:
            raise _bad("--price", value, "a price in USD per chip-hour, > 0") from None
        if not 0 < usd < math.inf:
            raise _bad("--price", value, "a price in USD per chip-hour, > 0")
        prices.setdefault(gen, {})[model] = usd
    notes = table.notes + (f" Overridden: {', '.join(overrides)}." if overrides else "")
    return PriceTable(table.date, table.source, notes, prices)


# ----------------------------------------------------------------------------------- model


HF_CONFIG_MAX_BYTES = 1 << 20
"""The most of a ``config.json`` read (a model's is a few kB)."""
HF_CONFIG_MAX_COUNT = model_config.MAX_COUNT
"""The largest count (layers, sizes, heads, experts) a config may give."""


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of ``path``, read up to `HF_CONFIG_MAX_BYTES` (PlanError beyond)."""
    try:
        with open(path, "rb") as source:
            raw = source.read(HF_CONFIG_MAX_BYTES + 1)
    except OSError as err:
        raise PlanError(f"--hf-config: cannot read {str(path)!r}: {err.strerror}") from None
    if len(raw) > HF_CONFIG_MAX_BYTES:
        raise PlanError(
            f"--hf-config: {path} is larger than the {HF_CONFIG_MAX_BYTES} bytes allowed "
            "(a model's config.json is a few kB)"
        )
    try:
        data = json.loads(raw)
    except ValueError as err:  # JSONDecodeError, undecodable bytes, an int past its digits
        raise PlanError(f"--hf-config: {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise PlanError(f"--hf-config: {path} must hold a JSON object")
    return data


def hf_config_keys(path: str | Path) -> dict[str, int | bool]:
    """The keys of ``path`` the performance model reads, checked (`model_config.canonical`):
    what `--emit` writes as spec.model.architecture."""
    try:
        return model_config.canonical(read_hf_config(path), f"--hf-config: {path}")
    except model_config.ModelConfigError as err:
        raise PlanError(str(err)) from None


def profile_from_hf_config(path: str | Path) -> ModelProfile:
    """A `ModelProfile` from a Hugging Face ``config.json`` (dense or MoE decoder), as the
    operator makes one from spec.model.architecture (`sglang_tpu.model_config`)."""
    cfg = read_hf_config(path)
    where = f"--hf-config: {path}"
    try:
        text = model_config.text_config(cfg, where)
        name = str(text.get("_name_or_path") or cfg.get("_name_or_path") or "")
        name = (name or Path(path).parent.name or "custom").lower()
        return model_config.profile_from_config(cfg, where, name)
    except model_config.ModelConfigError as err:
        raise PlanError(str(err)) from None


# ------------------------------------------------------------------------------------ SLOs


@dataclass(frozen=True)
class Slo:
    ttft_p99: float
    itl_p99: float
    ttft_p50: float | None = None
    itl_p50: float | None = None

    def validate(self) -> None:
        for name in ("ttft_p99", "itl_p99", "ttft_p50", "itl_p50"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                flag = "--" + name.replace("_", "-")
                raise _bad(flag, value, "> 0 seconds")
        if self.ttft_p50 is not None and self.ttft_p50 > self.ttft_p99:
            raise _bad("--ttft-p50", self.ttft_p50, f"<= --ttft-p99 ({self.ttft_p99})")
        if self.itl_p50 is not None and self.itl_p50 > self.itl_p99:
            raise _bad("--itl-p50", self.itl_p50, f"<= --itl-p99 ({self.itl_p99})")

    def met(self, s: Mapping[str, Any]) -> bool:
        """Every request finished, and each percentile within its target (ITL: per request,
        its mean time between output tokens)."""
        if s["failed"] or s["unfinished"] or not s["completed"]:
            return False
        checks = (
            ("ttft_p99", self.ttft_p99), ("itl_p99", self.itl_p99),
            ("ttft_p50", self.ttft_p50), ("itl_p50", self.itl_p50),
        )  # fmt: skip
        return all(limit is None or s[key] <= limit for key, limit in checks)


# ---------------------------------------------------------------------------------- search


@dataclass(frozen=True)
class PlanInputs:
    fleet: FleetConfig
    """Model, workload and engine settings; replicas, rate and policy are the planner's."""
    peak_rate: float
    """Requests per second to serve at the daily peak."""
    slo: Slo
    shapes: tuple[SliceShape, ...]
    prices: PriceTable
    pricing: str = "on-demand"
    trough: float = 0.35
    context_length: int = 32_768
    output_input_cost_ratio: float = DEFAULT_OUTPUT_INPUT_COST_RATIO
    sim_replicas: int = 4
    window_seconds: float = 180.0
    warmup_seconds: float = 30.0
    max_replicas: int = 1024
    host_kv_size_gb: int | None = None
    """Each replica's host-memory KV tier, GB per rank (`spec.kvCache.host.sizeGB`); None:
    none. A slice whose host cannot hold it (`host_kv_tokens`) is not planned."""

    def validate(self) -> None:
        if not 0 < self.peak_rate < math.inf:
            raise _bad("--rate", self.peak_rate, "> 0 requests per second")
        self.slo.validate()
        if self.pricing not in PRICING_MODELS:
            raise _bad("--pricing", self.pricing, ", ".join(PRICING_MODELS))
        if not self.shapes:
            raise PlanError("--topologies: no (generation, topology) left to plan; allowed: "
                            "topologies of the catalog for the --generations given")  # fmt: skip
        if not 0 <= self.trough <= 1:
            raise _bad("--trough", self.trough, "0..1 (the daily low / the daily peak)")
        if not 0 < self.output_input_cost_ratio < math.inf:
            raise _bad("--output-input-cost-ratio", self.output_input_cost_ratio, "> 0")
        if self.sim_replicas < 1:
            raise _bad("--sim-replicas", self.sim_replicas, ">= 1")
        if not self.window_seconds > self.warmup_seconds >= 0:
            raise _bad("--window", self.window_seconds, f"> the warm-up ({self.warmup_seconds} s)")
        if self.host_kv_size_gb is not None and self.host_kv_size_gb < 1:
            raise _bad("--host-kv-size-gb", self.host_kv_size_gb, ">= 1 GB per rank")
        if self.context_length < BLOCK_TOKENS:
            raise _bad("--context-length", self.context_length, f">= {BLOCK_TOKENS}")
        self.fleet.validate()


@dataclass
class Candidate:
    shape: SliceShape
    fits: bool = True
    why_not: str = ""
    capacity_rps: float = 0.0
    """Requests per second one replica serves within the SLOs."""
    at_capacity: dict[str, Any] = field(default_factory=dict)
    replicas: int = 0
    usd_per_chip_hour: float | None = None
    simulations: int = 0

    @property
    def chips(self) -> int:
        return self.shape.chips

    @property
    def key(self) -> str:
        return f"{self.shape.generation.name} {self.shape.topology}"

    @property
    def tensor_parallel(self) -> int:
        return self.shape.devices

    def per_replica(self, name: str) -> float:
        value = self.at_capacity.get(name, 0.0)
        return float(value) / self.sim_replicas if self.at_capacity else 0.0

    sim_replicas: int = 1

    def usd_per_million_output(self, ratio: float) -> float | None:
        """GIQ: accelerator $/s / (input tok/s / r + output tok/s), per million."""
        if self.usd_per_chip_hour is None or not self.at_capacity:
            return None
        dollars_per_second = self.usd_per_chip_hour * self.chips / 3600.0
        inp = self.per_replica("input_tokens_per_second")
        out = self.per_replica("output_tokens_per_second")
        if out <= 0:
            return None
        return dollars_per_second / (inp / ratio + out) * 1e6

    def usd_per_hour(self) -> float | None:
        if self.usd_per_chip_hour is None:
            return None
        return self.usd_per_chip_hour * self.chips * self.replicas


@dataclass(frozen=True)
class PdSplit:
    """A disaggregated server's replicas per role at the peak (`disaggregate`)."""

    prefill: int
    decode: int
    load: float
    """The peak's rate multiple the split keeps up with, by the need model."""
    colocated_replicas: int
    colocated_load: float
    """The same for the choice's colocated replicas, by the same model."""
    requests: int
    """Requests of the sample it was computed over."""


@dataclass
class Plan:
    inputs: PlanInputs
    candidates: list[Candidate]
    verified: dict[str, Any] | None = None
    disaggregated: PdSplit | None = None

    @property
    def ranked_by(self) -> str:
        """``price`` when every candidate that serves the demand has a price, else ``tokens
        per chip`` (a slice without a price, tpu7x's today, is ranked, not left last)."""
        ratio = self.inputs.output_input_cost_ratio
        usable = [c for c in self.candidates if c.fits and c.capacity_rps > 0]
        priced = all(c.usd_per_million_output(ratio) is not None for c in usable)
        return "price" if priced else "tokens per chip"

    def ranked(self) -> list[Candidate]:
        """By $/1M output tokens, or, when a candidate has no price, by tokens per second per
        chip at capacity (highest first); ties: the fewest chips for the peak."""
        ratio = self.inputs.output_input_cost_ratio
        usable = [c for c in self.candidates if c.fits and c.capacity_rps > 0]
        by_price = self.ranked_by == "price"

        def key(c: Candidate) -> tuple[float, float]:
            if not by_price:
                tokens = c.per_replica("tokens_per_second") / c.chips
                return (-tokens, c.chips * c.replicas)
            cost = c.usd_per_million_output(ratio)
            return (math.inf if cost is None else cost, c.chips * c.replicas)

        return sorted(usable, key=key)

    def pareto(self) -> list[Candidate]:
        """Candidates no other beats on both $/1M output tokens and p99 TTFT at capacity."""
        ratio = self.inputs.output_input_cost_ratio

        def cost(c: Candidate) -> float:
            usd = c.usd_per_million_output(ratio)
            return math.inf if usd is None else usd

        priced = [c for c in self.ranked() if c.usd_per_million_output(ratio) is not None]
        ranked = sorted(priced, key=lambda c: (cost(c), c.chips * c.replicas))
        front: list[Candidate] = []
        best_ttft = math.inf
        for c in ranked:  # by cost, cheapest first
            ttft = float(c.at_capacity.get("ttft_p99") or math.inf)
            if ttft < best_ttft:
                front.append(c)
                best_ttft = ttft
        return front

    @property
    def best(self) -> Candidate | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None


def host_kv_tokens(inputs: PlanInputs, shape: SliceShape, profile: ModelProfile) -> int:
    """Tokens of one replica's host tier: ``host_kv_size_gb`` per rank on each of its ranks
    (one per device), each rank holding its share of a token's KV; 0 without a tier.
    HostKvDoesNotFit when the machine type's host cannot hold it (the operator's rule: the
    engine's default memory limit less its own needs and SGLang's reserve)."""
    size = inputs.host_kv_size_gb
    if size is None:
        return 0
    from tpuserve_operator.host_kv import default_memory_limit

    largest = hicache.max_size_gb(shape, default_memory_limit(shape))
    if size > largest:
        raise HostKvDoesNotFit(
            f"--host-kv-size-gb {size} does not fit a {shape.machine_type} host "
            f"({hicache.ranks_per_host(shape)} ranks); allowed there: at most {largest}"
        )
    ranks = hicache.ranks_per_host(shape) * shape.hosts
    return int(size * hicache.GB * ranks // profile.kv_bytes_per_token())


class HostKvDoesNotFit(ValueError):
    """The host tier asked for does not fit the slice's hosts."""


def _sim_config(
    inputs: PlanInputs, shape: SliceShape, replicas: int, rate: float, host_tokens: int = 0
) -> FleetConfig:
    return replace(
        inputs.fleet, generation=shape.generation.name, topology=shape.topology,
        replicas=replicas, initial_replicas=None, min_replicas=0, policy="precise",
        router_replicas=1, peak_rate=rate, trough=1.0, bursts_per_hour=0.0, autoscale=False,
        duration_seconds=inputs.window_seconds, warmup_seconds=inputs.warmup_seconds,
        preemptions_per_replica_hour=0.0, slo_ttft_seconds=inputs.slo.ttft_p99,
        slo_itl_seconds=inputs.slo.itl_p99, drain_seconds=inputs.window_seconds,
        host_cache_tokens=host_tokens,
    )  # fmt: skip


def max_rate_within_slo(
    run: Callable[[float], dict[str, Any]], slo: Slo, start: float
) -> tuple[float, dict[str, Any], int]:
    """The largest rate ``run`` serves within ``slo``: double from ``start`` until it fails,
    then bisect (`BISECTIONS` steps). Returns (rate, the summary at it, simulations run);
    rate 0 when even ``start`` fails after halving it `DOUBLINGS` times."""
    runs = 0
    lo, lo_summary = 0.0, {}
    hi = start
    for _ in range(DOUBLINGS):
        s = run(hi)
        runs += 1
        if not slo.met(s):
            break
        lo, lo_summary = hi, s
        hi *= 2
    else:
        return lo, lo_summary, runs
    if lo == 0.0:  # the first rate failed: halve until one passes
        for _ in range(DOUBLINGS):
            hi /= 2
            s = run(hi)
            runs += 1
            if slo.met(s):
                lo, lo_summary = hi, s
                hi *= 2
                break
        else:
            return 0.0, {}, runs
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        s = run(mid)
        runs += 1
        if slo.met(s):
            lo, lo_summary = mid, s
        else:
            hi = mid
    return lo, lo_summary, runs


def evaluate(inputs: PlanInputs, shape: SliceShape) -> Candidate:
    """One slice shape: fit check, then its per-replica capacity within the SLOs."""
    c = Candidate(shape, sim_replicas=inputs.sim_replicas)
    c.usd_per_chip_hour = inputs.prices.chip_hour(shape.generation.name, inputs.pricing)
    profile = inputs.fleet.profile or get_profile(inputs.fleet.model, "--model")
    try:
        _check_fits(shape, profile, inputs)
        host_tokens = host_kv_tokens(inputs, shape, profile)
    except ModelDoesNotFit as err:
        c.fits, c.why_not = False, str(err).split(";")[0]
        return c
    except HostKvDoesNotFit as err:
        c.fits, c.why_not = False, str(err)
        return c

    def run(per_replica: float) -> dict[str, Any]:
        config = _sim_config(
            inputs, shape, inputs.sim_replicas, per_replica * inputs.sim_replicas, host_tokens
        )
        return _summary(run_fleet(config))

    rate, summary, runs = max_rate_within_slo(run, inputs.slo, 0.5)
    c.capacity_rps, c.at_capacity, c.simulations = rate, summary, runs
    if rate <= 0:
        c.why_not = "no load meets the SLOs"
        return c
    c.replicas = math.ceil(inputs.peak_rate / rate)
    if c.replicas > inputs.max_replicas:
        c.fits, c.why_not = False, f"needs {c.replicas} replicas > {inputs.max_replicas}"
    return c


def _summary(result: FleetResult) -> dict[str, Any]:
    s = result.summary()
    window = result.window_seconds
    s["input_tokens_per_second"] = result.input_tokens / window
    s["concurrency"] = result.request_seconds / window
    return s


def _check_fits(shape: SliceShape, profile: ModelProfile, inputs: PlanInputs) -> None:
    check_fits(shape, profile, inputs.fleet.quantization, "auto", inputs.context_length)


def plan(inputs: PlanInputs, progress: Callable[[str], None] | None = None) -> Plan:
    inputs.validate()
    candidates = []
    for shape in inputs.shapes:
        if progress:
            progress(f"{shape.generation.name} {shape.topology}")
        candidates.append(evaluate(inputs, shape))
    return Plan(inputs, candidates)


def verify(result: Plan) -> dict[str, Any]:
    """The top choice at full size: the largest total rate its ``replicas`` serve within the
    SLOs, measured by the fleet model, against the planner's ``replicas x capacity``."""
    best = result.best
    if best is None:
        raise PlanError("no candidate serves the workload within the SLOs: nothing to verify")
    inputs = result.inputs
    predicted = best.capacity_rps * best.replicas

    def run(rate: float) -> dict[str, Any]:
        return _summary(run_fleet(_sim_config(inputs, best.shape, best.replicas, rate)))

    measured, summary, runs = max_rate_within_slo(run, inputs.slo, predicted / 3)
    return {
        "choice": best.key,
        "replicas": best.replicas,
        "predicted_rps": predicted,
        "measured_rps": measured,
        "measured_within": (measured, measured * (1 + 2.0**-BISECTIONS)),
        "ratio": measured / predicted if predicted else None,
        "simulations": runs,
        "at_measured": summary,
    }


def sample_requests(fleet: FleetConfig, rate: float, seconds: float) -> list[pd_split.PdRequest]:
    """The workload's requests over ``seconds`` at a constant ``rate``, in arrival order, not
    served: a turn's arrival does not depend on how the one before was served."""
    sim = FleetSim(
        replace(fleet, replicas=1, peak_rate=rate, trough=1.0, duration_seconds=seconds,
                bursts_per_hour=0.0, autoscale=False)
    )  # fmt: skip
    return [
        pd_split.PdRequest(r.arrival, r.blocks, r.prompt, r.output)
        for r in sim.requests(PD_SAMPLE_REQUESTS)
    ]


def disaggregate(result: Plan, choice: Candidate) -> PdSplit:
    """Prefill and decode replicas of ``choice``'s slice for the peak, by the performance
    model's need per role over a sample of the workload at the peak rate (prefill compute
    for the prompts' uncached tokens; decode compute and KV room; `pd_split`): the fewest
    replicas, split max-min between the roles, that keep up with the peak as well as the
    choice's colocated replicas do by the same model. The fleet model found those colocated
    replicas within the SLOs; this model has no SLO, so the comparison is what carries over."""
    inputs = result.inputs
    fleet = inputs.fleet
    profile = fleet.profile or get_profile(fleet.model, "--model")
    timer = StepTimer(choice.shape, profile, fleet.quantization)
    cache_tokens = kv_pool_tokens(choice.shape, profile, fleet.quantization)
    requests = sample_requests(fleet, inputs.peak_rate, inputs.window_seconds)
    if len(requests) < 2:
        raise PlanError(
            f"--window: {inputs.window_seconds} s at {inputs.peak_rate:g} req/s brings "
            f"{len(requests)} request(s); allowed: a window with at least two to split by"
        )
    block = fleet.block_tokens
    colocated = pd_split.colocated_load(requests, timer, choice.replicas, cache_tokens, block)
    budget = pd.DEFAULT_ITL_BUDGET_SECONDS  # unused by "always": every request is paired
    for engines in range(2, max(2, 4 * choice.replicas) + 1):
        pools = pd_split.split("always", requests, timer, engines, budget, cache_tokens, block)
        if pools.load >= colocated:
            break
    return PdSplit(
        pools.prefill, pools.decode, pools.load, choice.replicas, colocated, len(requests)
    )


# ------------------------------------------------------------------------------------ shapes


def allowed_shapes(
    generations: Sequence[str] | None, topologies: Sequence[str] | None, multi_host: bool
) -> tuple[SliceShape, ...]:
    """Catalog shapes of ``generations`` (all when None), only ``topologies`` when given,
    single-host ones unless ``multi_host``."""
    gens = list(generations) if generations else generation_names()
    for g in gens:
        if g not in generation_names():
            raise _bad("--generations", g, ", ".join(generation_names()))
    shapes = [s for s in SLICE_SHAPES if s.generation.name in gens]
    if topologies:
        known = {s.topology for s in shapes}
        for t in topologies:
            if t not in known:
                raise _bad("--topologies", t, ", ".join(sorted(known)))
            for g in gens:
                try:
                    lookup(g, t)
                except CatalogError:
                    continue
        shapes = [s for s in shapes if s.topology in topologies]
    if not multi_host:
        shapes = [s for s in shapes if not s.multi_host]
    return tuple(shapes)


# ------------------------------------------------------------------------------- demand


def mean_tokens_per_request(fleet: FleetConfig, samples: int = 4000) -> tuple[float, float]:
    """(mean prompt tokens, mean output tokens) of the workload, by drawing ``samples``."""
    sim = FleetSim(
        replace(fleet, replicas=1, peak_rate=1.0, duration_seconds=1e9, bursts_per_hour=0.0,
                autoscale=False)
    )  # fmt: skip
    drawn = sim.session_requests(samples)
    return statistics.fmean(r.prompt for r in drawn), statistics.fmean(r.output for r in drawn)


def peak_rate_for_tokens_per_day(tokens_per_day: float, fleet: FleetConfig, trough: float) -> float:
    """The peak request rate whose daily shape (mean ``(1 + trough) / 2`` of the peak) carries
    ``tokens_per_day`` (prompt + output tokens)."""
    prompt, output = mean_tokens_per_request(fleet)
    mean_rate = tokens_per_day / 86_400.0 / (prompt + output)
    return mean_rate / ((1.0 + trough) / 2.0)
