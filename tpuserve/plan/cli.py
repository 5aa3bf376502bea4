"""`tpuserve plan`: the command line of the capacity planner (`tpuserve.plan.planner`)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from sglang_tpu import cli_types
from sglang_tpu.perf_model import DEFAULT_PROFILE, get_profile, profile_names
from sglang_tpu.topology import generation_names
from tpuserve.fleet import FleetConfig
from tpuserve.plan import emit
from tpuserve.plan.planner import (
    PERF_MODEL_ERROR,
    PRICING_MODELS,
    Candidate,
    Plan,
    PlanError,
    PlanInputs,
    Slo,
    allowed_shapes,
    disaggregate,
    hf_config_keys,
    load_prices,
    override_prices,
    peak_rate_for_tokens_per_day,
    plan,
    profile_from_hf_config,
    verify,
)

DESCRIPTION = """Plan TPU capacity and cost for a model, a workload, a demand and SLOs.

For each allowed TPU slice where the model fits, the largest load one replica serves within
the SLOs is found by running the fleet model (tpuserve.fleet: the calibrated
performance model's step times, continuous batching, a prefix cache, tpuserve's default
routing) at rising rates; replicas for the peak follow, then cost per million output tokens
by GKE Inference Quickstart's formula. Prints a table, the cost/latency Pareto front and the
performance model's error band; --emit writes the chosen TPUModelServer (autoscaling bounds
from the daily shape), checked by the operator's admission validation. The fleet model
serves prefill and decode colocated; --disaggregate also splits the chosen replicas between a
prefill and a decode role by the performance model's need per role (not simulated against
the SLOs; docs/pd.md).

examples:
  tpuserve plan --model llama-3.1-8b --preset chat --rate 100 --ttft-p99 1 --itl-p99 0.05
  tpuserve plan --model qwen3-8b --preset long-document --rate 20 --generations v6e,v5e
  tpuserve plan --model llama-3.1-8b --preset agentic --tokens-per-day 6e9 --emit plan.yaml
"""

PRESETS: dict[str, dict[str, Any]] = {
    "chat": {
        "workload": "lengths", "input_median": 1200.0, "input_sigma": 0.8, "output_min": 100,
        "output_max": 500, "reuse_share": 0.3, "prefix_groups": 32, "block_tokens": 64,
    },
    "long-document": {
        "workload": "lengths", "input_median": 7000.0, "input_sigma": 0.2, "output_min": 32,
        "output_max": 256, "reuse_share": 0.9, "prefix_groups": 24, "block_tokens": 64,
    },
    "agentic": {"workload": "mooncake", "conversation_share": 0.0},
    "mooncake": {"workload": "mooncake", "conversation_share": 0.5},
}  # fmt: skip
"""Workload presets: chat (1.2k-token prompts, 30 % shared system prompts), long-document QA
(7k-token documents, 90 % of each prompt, questions of W5's shape), agentic (Mooncake's
tool&agent shape), mooncake (conversation + tool&agent, half each)."""
TRACE_BLOCK_TOKENS = 64
"""Prefix-cache granularity of the `lengths` workloads (and of a trace's reuse)."""
LENGTH_FLAGS = ("input_median", "input_sigma", "output_min", "output_max", "reuse_share",
                "prefix_groups")  # fmt: skip


def _csv(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: a comma list")
    return items


def _trough(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not allowed; allowed: 0 to 1 (the daily low as a share of the peak)"
        )
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: 0 <= share < 1")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    which = model.add_mutually_exclusive_group()
    which.add_argument(
        "--model", help=f"A catalog profile or its Hugging Face id (default: {DEFAULT_PROFILE}; "
        f"profiles: {', '.join(profile_names())})."
    )  # fmt: skip
    which.add_argument("--hf-config", metavar="FILE", help="A Hugging Face config.json.")
    model.add_argument(
        "--model-source", help="spec.model.source to emit (default: hf://ID of the profile; "
        "required with --hf-config and --emit)."
    )  # fmt: skip
    model.add_argument("--quantization", choices=("bf16", "fp8"), default="bf16",
                       help="Weight format (default: bf16).")  # fmt: skip
    model.add_argument("--engine", choices=("sglang", "sglang-jax", "simulated"), default="sglang",
                       help="spec.engine.type to emit and time (default: sglang).")  # fmt: skip
    model.add_argument("--host-kv-size-gb", type=cli_types.positive_int, metavar="GB",
                       help="A host-memory KV tier of GB per rank on every replica "
                       "(spec.kvCache.host.sizeGB, docs/host-kv-tier.md), modelled and "
                       "emitted; a slice whose host cannot hold it is not planned "
                       "(default: no tier).")  # fmt: skip
    model.add_argument("--context-length", type=cli_types.positive_int,
                       help="Longest prompt + output (default: what the workload needs, at "
                       "most the model's).")  # fmt: skip
    work = parser.add_argument_group("workload")
    work.add_argument("--preset", choices=sorted(PRESETS), default="chat",
                      help="Lengths and prefix reuse to start from (default: chat).")  # fmt: skip
    work.add_argument("--trace", metavar="FILE",
                      help="A trace (`tpuserve bench` formats): its prompt/output lengths and "
                      "prefix reuse replace the preset's (summarised, not replayed).")  # fmt: skip
    work.add_argument("--input-median", type=cli_types.positive_float,
                      help="Median prompt length, tokens (log-normal).")  # fmt: skip
    work.add_argument("--input-sigma", type=cli_types.non_negative_float,
                      help="Log-normal sigma of prompt lengths.")  # fmt: skip
    work.add_argument("--output-min", type=cli_types.positive_int,
                      help="Shortest output, tokens (uniform up to --output-max).")  # fmt: skip
    work.add_argument("--output-max", type=cli_types.positive_int, help="Longest output, tokens.")
    work.add_argument("--reuse-share", type=_share,
                      help="Share of the median prompt that is a shared prefix.")  # fmt: skip
    work.add_argument("--prefix-groups", type=cli_types.positive_int,
                      help="How many distinct shared prefixes the prompts draw from.")  # fmt: skip
    demand = parser.add_argument_group("demand")
    how = demand.add_mutually_exclusive_group(required=True)
    how.add_argument("--rate", type=cli_types.positive_float,
                     help="Requests per second at the daily peak.")  # fmt: skip
    how.add_argument("--tokens-per-day", type=cli_types.positive_float,
                     help="Prompt + output tokens a day, spread by the daily shape.")  # fmt: skip
    demand.add_argument("--trough", type=_trough, default=0.35,
                        help="The daily low as a share of the peak (default: 0.35).")  # fmt: skip
    slo = parser.add_argument_group("SLOs (seconds)")
    slo.add_argument("--ttft-p99", type=cli_types.positive_float, default=2.0,
                     help="p99 time to first token (default: 2).")  # fmt: skip
    slo.add_argument("--itl-p99", type=cli_types.positive_float, default=0.1,
                     help="p99 inter-token latency (default: 0.1).")  # fmt: skip
    slo.add_argument("--ttft-p50", type=cli_types.positive_float,
                     help="p50 time to first token (default: none).")  # fmt: skip
    slo.add_argument("--itl-p50", type=cli_types.positive_float,
                     help="p50 inter-token latency (default: none).")  # fmt: skip
    search = parser.add_argument_group("search")
    gens = ", ".join(generation_names())
    search.add_argument("--generations", type=_csv, help=f"Allowed: {gens} (default: all).")
    search.add_argument("--topologies", type=_csv, help="Allowed topologies (default: every "
                        "single-host one of the generations).")  # fmt: skip
    search.add_argument("--multi-host", action="store_true", help="Also plan multi-host slices.")
    search.add_argument("--sim-replicas", type=cli_types.positive_int, default=4,
                        help="Replicas simulated per load tried (default: 4).")  # fmt: skip
    search.add_argument("--window", type=cli_types.positive_float, default=180.0,
                        help="Simulated seconds per load tried (default: 180).")  # fmt: skip
    search.add_argument("--verify", action="store_true",
                        help="Measure the top choice's capacity at full size too.")  # fmt: skip
    search.add_argument("--seed", type=cli_types.non_negative_int, default=0,
                        help="Seed of the simulated traffic (default: 0).")  # fmt: skip
    cost = parser.add_argument_group("cost")
    cost.add_argument("--pricing", choices=PRICING_MODELS, default="on-demand",
                      help="The chip-hour price that ranks (default: on-demand).")  # fmt: skip
    cost.add_argument("--prices", metavar="FILE", help="A price table (the shipped one's format).")
    cost.add_argument("--price", action="append", default=[], metavar="GEN:MODEL=USD",
                      help="Override one chip-hour price, e.g. v6e:spot=1.10.")  # fmt: skip
    cost.add_argument("--output-input-cost-ratio", type=cli_types.positive_float, default=4.0,
                      help="r in GKE Inference Quickstart's $/1M output tokens: chip $/s over "
                      "(input tok/s / r + output tok/s) (default: 4).")  # fmt: skip
    out = parser.add_argument_group("output")
    out.add_argument("--disaggregate", action="store_true",
                     help="Also split the choice's replicas between a prefill and a decode role "
                     "by the performance model (docs/pd.md); --emit then writes them as "
                     "spec.disaggregation (--engine simulated only: SGLang has no TPU "
                     "transfer backend).")  # fmt: skip
    out.add_argument("--emit", metavar="FILE", help="Write the chosen TPUModelServer (YAML).")
    out.add_argument("--name", default="planned", help="metadata.name to emit.")
    out.add_argument("--json", action="store_true", help="Print one JSON object.")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except PlanError as err:
        print(f"tpuserve plan: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # the fleet model's and the catalog's checks
        print(f"tpuserve plan: {err}", file=sys.stderr)
        return 2


def workload_from_trace(path: str) -> dict[str, Any]:
    """A trace's lengths and prefix reuse as `lengths` workload parameters."""
    from sglang_tpu.tokenizer import load_tokenizer
    from tpuserve.bench.traces import TraceError, read_trace, token_ids_of
    from tpuserve_router.kv.block_index import block_keys

    try:
        trace = read_trace(path)
    except TraceError as err:
        raise PlanError(str(err)) from None
    tok = load_tokenizer()
    prompts: list[int] = []
    outputs: list[int] = []
    seen: set[int] = set()
    firsts: set[int] = set()
    reused = 0
    for req in trace:
        ids = token_ids_of(req, tok)
        keys = block_keys(ids, TRACE_BLOCK_TOKENS)
        prompts.append(len(ids))
        outputs.append(req.max_tokens)
        hit = True
        for i, key in enumerate(keys):
            if hit and key in seen:
                reused += min(TRACE_BLOCK_TOKENS, len(ids) - i * TRACE_BLOCK_TOKENS)
            else:
                hit = False
                seen.add(key)
        if keys:
            firsts.add(keys[0])
    logs = [math.log(max(1, p)) for p in prompts]
    outputs.sort()
    return {
        "workload": "lengths",
        "block_tokens": 64,
        "input_median": float(statistics.median(prompts)),
        "input_sigma": min(3.0, statistics.pstdev(logs)) if len(logs) > 1 else 0.0,
        "output_min": max(1, outputs[len(outputs) // 20]),
        "output_max": max(1, outputs[min(len(outputs) - 1, len(outputs) * 19 // 20)]),
        "reuse_share": min(0.95, reused / max(1, sum(prompts))),
        "prefix_groups": max(1, min(1000, len(firsts))),
    }


def build_inputs(args: argparse.Namespace) -> tuple[PlanInputs, str | None]:
    """The planner's inputs from the flags (every one checked), and the model source to emit."""
    if args.hf_config:
        profile = profile_from_hf_config(args.hf_config)
        model_name = profile.name
        source = args.model_source
    else:
        name = args.model or DEFAULT_PROFILE
        profile = get_profile(name, "--model")
        model_name, source = profile.name, args.model_source or f"hf://{profile.hf_ids[0]}"
    params: dict[str, Any] = dict(PRESETS[args.preset])
    if args.trace:
        params.update(workload_from_trace(args.trace))
    for key in LENGTH_FLAGS:
        value = getattr(args, key)
        if value is not None:
            params[key] = value
            params["workload"] = "lengths"
    if params.get("output_min", 1) > params.get("output_max", 1 << 30):
        raise PlanError(
            f"--output-min: {params['output_min']} is not allowed; allowed: <= --output-max "
            f"({params['output_max']})"
        )
    context = args.context_length or _context_needed(params, profile.context_length)
    if context > profile.context_length:
        raise PlanError(
            f"--context-length: {context} is not allowed; allowed: <= the model's "
            f"{profile.context_length}"
        )
    fleet = FleetConfig(
        model=model_name if not args.hf_config else DEFAULT_PROFILE,
        profile=profile if args.hf_config else None, quantization=args.quantization,
        seed=args.seed, engine="sglang-jax" if args.engine == "sglang-jax" else "sglang", **params,
    )  # fmt: skip
    fleet.validate()
    prices = override_prices(load_prices(args.prices), args.price)
    shapes = allowed_shapes(args.generations, args.topologies, args.multi_host)
    slo = Slo(args.ttft_p99, args.itl_p99, args.ttft_p50, args.itl_p50)
    slo.validate()
    if args.rate is not None:
        peak = args.rate
    else:
        peak = peak_rate_for_tokens_per_day(args.tokens_per_day, fleet, args.trough)
    inputs = PlanInputs(
        fleet=fleet, peak_rate=peak, slo=slo, shapes=shapes, prices=prices,
        pricing=args.pricing, trough=args.trough, context_length=context,
        output_input_cost_ratio=args.output_input_cost_ratio,
        sim_replicas=args.sim_replicas, window_seconds=args.window,
        warmup_seconds=min(30.0, args.window / 4), host_kv_size_gb=args.host_kv_size_gb,
    )  # fmt: skip
    inputs.validate()
    return inputs, source


def _context_needed(params: dict[str, Any], model_max: int) -> int:
    """What the workload needs: the longest Mooncake prompt + answer, or the lengths
    distribution's 99.9th percentile prompt + the longest output; a multiple of 1,024."""
    if params.get("workload") == "mooncake":
        need = 92_000 + 700
    else:
        median = float(params.get("input_median", 1000.0))
        sigma = float(params.get("input_sigma", 0.5))
        need = int(median * math.exp(3.1 * sigma)) + int(params.get("output_max", 500))
    need = -(-need // 1024) * 1024
    return min(model_max, max(4096, need))


def _run(args: argparse.Namespace) -> int:
    inputs, source = build_inputs(args)
    if args.emit and not source:
        raise PlanError("--model-source: required with --hf-config and --emit; allowed: "
                        "hf://ORG/NAME, gs://BUCKET/PATH or pvc://CLAIM/PATH")  # fmt: skip
    if args.disaggregate and args.emit and args.engine != "simulated":
        raise PlanError(emit.disaggregated_refusal(args.engine))  # before the search
    progress = None if args.json else (lambda key: print(f"planning {key} ...", file=sys.stderr))
    result = plan(inputs, progress)
    if args.verify and result.best is not None:
        result.verified = verify(result)
    if args.disaggregate and result.best is not None:
        result.disaggregated = disaggregate(result, result.best)
    manifest_text = None
    if args.emit:
        best = result.best
        if best is None:
            raise PlanError("no candidate serves the workload within the SLOs: nothing to emit")
        assert source is not None
        keys = hf_config_keys(args.hf_config) if args.hf_config else None
        spec = emit.server_spec(result, best, source, args.engine, args.pricing == "spot", keys)
        manifest_text = emit.manifest(args.name, spec, header_lines(result, best))
        Path(args.emit).write_text(manifest_text)
    if args.json:
        print(json.dumps(to_json(result), indent=1, default=str))
    else:
        print(render(result))
        if args.emit:
            print(f"\nwrote {args.emit}")
    return 0


def header_lines(result: Plan, best: Candidate) -> list[str]:
    inputs = result.inputs
    split = result.disaggregated
    roles = [] if split is None else [
        f"disaggregated: {split.prefill} prefill + {split.decode} decode replicas at the peak, "
        f"keeping up as well as {split.colocated_replicas} colocated ones by the performance "
        "model's need per role (not simulated against the SLOs)"
    ]  # fmt: skip
    return [
        f"tpuserve plan: {best.replicas} x {best.key} ({best.replicas * best.chips} chips) for "
        f"{inputs.peak_rate:.1f} req/s at the peak",
        f"capacity {best.capacity_rps:.2f} req/s per replica within p99 TTFT "
        f"{inputs.slo.ttft_p99} s, p99 ITL {inputs.slo.itl_p99} s (fleet model, error band "
        f"+-{PERF_MODEL_ERROR['median']:.0%} median, {PERF_MODEL_ERROR['worst']:.0%} worst)",
        f"autoscaling bounds: the daily trough ({inputs.trough:.2f} of the peak) to the peak",
        *roles,
    ]


def _row(c: Candidate, ratio: float) -> dict[str, Any]:
    cap = c.at_capacity
    out = c.per_replica("output_tokens_per_second")
    tokens = c.per_replica("tokens_per_second")
    return {
        "slice": c.key,
        "tp": c.tensor_parallel,
        "chips_per_replica": c.chips,
        "fits": c.fits,
        "why_not": c.why_not,
        "capacity_rps_per_replica": c.capacity_rps,
        "replicas": c.replicas,
        "chips": c.replicas * c.chips,
        "output_tokens_per_second_per_chip": out / c.chips if c.chips else 0.0,
        "tokens_per_second_per_chip": tokens / c.chips if c.chips else 0.0,
        "ttft_p50": cap.get("ttft_p50"),
        "ttft_p99": cap.get("ttft_p99"),
        "itl_p50": cap.get("itl_p50"),
        "itl_p99": cap.get("itl_p99"),
        "cache_hit_rate": cap.get("cache_hit_rate"),
        "usd_per_chip_hour": c.usd_per_chip_hour,
        "usd_per_hour": c.usd_per_hour(),
        "usd_per_million_output_tokens": c.usd_per_million_output(ratio),
        "simulations": c.simulations,
    }


def to_json(result: Plan) -> dict[str, Any]:
    inputs = result.inputs
    ratio = inputs.output_input_cost_ratio
    best = result.best
    return {
        "peak_rate": inputs.peak_rate,
        "trough": inputs.trough,
        "slo": vars(inputs.slo),
        "context_length": inputs.context_length,
        "pricing": inputs.pricing,
        "prices": {"date": inputs.prices.date, "source": inputs.prices.source},
        "candidates": [_row(c, ratio) for c in result.candidates],
        "ranked": [c.key for c in result.ranked()],
        "pareto": [c.key for c in result.pareto()],
        "choice": best.key if best else None,
        "error_band": PERF_MODEL_ERROR,
        "verified": result.verified,
        "utilisation_at_peak": (
            inputs.peak_rate / (best.capacity_rps * best.replicas) if best else None
        ),
        "disaggregated": vars(result.disaggregated) if result.disaggregated else None,
    }


def _f(value: Any, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def render(result: Plan) -> str:
    inputs = result.inputs
    ratio = inputs.output_input_cost_ratio
    lines = [
        f"demand: {inputs.peak_rate:.1f} req/s at the daily peak (trough {inputs.trough:.2f}); "
        f"SLO p99 TTFT {inputs.slo.ttft_p99} s, p99 ITL {inputs.slo.itl_p99} s"
        + (f", p50 TTFT {inputs.slo.ttft_p50} s" if inputs.slo.ttft_p50 else "")
        + (f", p50 ITL {inputs.slo.itl_p50} s" if inputs.slo.itl_p50 else ""),
        f"prices: {inputs.pricing}, {inputs.prices.source} ({inputs.prices.date}); "
        f"$/1M output tokens by GIQ's formula, r = {ratio:g}",
        "",
        "| slice | TP | req/s per replica | replicas | chips | out tok/s/chip | TTFT p50/p99 s "
        "| ITL p50/p99 ms | hit rate | util at peak | $/h | $/1M out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = result.ranked() + [c for c in result.candidates if c not in result.ranked()]
    for c in order:
        r = _row(c, ratio)
        if not c.fits or c.capacity_rps <= 0:
            lines.append(f"| {c.key} | {c.tensor_parallel} | – | – | – | – | – | – | – | – | – "
                         f"| {c.why_not} |")  # fmt: skip
            continue
        util = inputs.peak_rate / (c.capacity_rps * c.replicas)
        itl50 = None if r["itl_p50"] is None else r["itl_p50"] * 1000
        itl99 = None if r["itl_p99"] is None else r["itl_p99"] * 1000
        lines.append(
            f"| {c.key} | {c.tensor_parallel} | {c.capacity_rps:.2f} | {c.replicas} "
            f"| {c.replicas * c.chips} | {r['output_tokens_per_second_per_chip']:.0f} "
            f"| {_f(r['ttft_p50'])}/{_f(r['ttft_p99'])} | {_f(itl50, '.0f')}/{_f(itl99, '.0f')} "
            f"| {_f(r['cache_hit_rate'])} | {util:.0%} | {_f(r['usd_per_hour'])} "
            f"| {_f(r['usd_per_million_output_tokens'], '.3f')} |"
        )
    front = result.pareto()
    lines += ["", "Pareto front ($/1M output tokens vs p99 TTFT at capacity): "
              + (", ".join(c.key for c in front) or "none (no prices)")]  # fmt: skip
    err = PERF_MODEL_ERROR
    lines.append(
        f"error band: the performance model is within {err['median']:.0%} (median) and "
        f"{err['worst']:.0%} (worst) of {err['rows']} published TPU serving figures "
        "(docs/engine-sim.md); capacities and costs carry that band"
    )
    best = result.best
    if best is not None:
        lo = best.capacity_rps * (1 - err["median"])
        hi = best.capacity_rps * (1 + err["median"])
        lines.append(
            f"choice: {best.replicas} x {best.key} = {best.replicas * best.chips} chips; "
            f"{best.capacity_rps:.2f} req/s per replica ({lo:.2f}-{hi:.2f} within the median "
            "error)"
        )
    if result.verified:
        v = result.verified
        lines.append(
            f"verified at full size: predicted {v['predicted_rps']:.1f} req/s, measured "
            f"{v['measured_rps']:.1f} req/s (the limit lies in [{v['measured_within'][0]:.1f}, "
            f"{v['measured_within'][1]:.1f}); ratio {_f(v['ratio'])}, {v['simulations']} runs)"
        )
    split = result.disaggregated
    if split is None or best is None:
        lines.append("prefill and decode colocated (--disaggregate: split between roles)")
    else:
        lines.append(
            f"disaggregated: {split.prefill} prefill + {split.decode} decode x {best.key}: "
            f"the fewest replicas that keep up with the peak as well as the {best.replicas} "
            f"colocated ones ({split.load:.2f}x vs {split.colocated_load:.2f}x the peak) by "
            f"the performance model's need per role over {split.requests} requests; not "
            "simulated against the SLOs (docs/pd.md)"
        )
    return "\n".join(lines)


def with_seed(inputs: PlanInputs, seed: int) -> PlanInputs:
    return replace(inputs, fleet=replace(inputs.fleet, seed=seed))
