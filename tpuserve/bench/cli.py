"""`tpuserve bench`: run one routing policy on one workload and print its summary."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import replace
from typing import Any

from sglang_tpu import cli_types, perf_model
from sglang_tpu.topology import CatalogError, generation_names, lookup
from tpuserve.bench import sizing, traces, workloads
from tpuserve.bench.anchors import policy_names
from tpuserve.bench.report import SLO_FACTOR, RequestRecord, recovery_seconds, summarize
from tpuserve.bench.sim_config import Fault, SimConfig
from tpuserve.bench.sim_runner import measure_rr_saturation, run_sim
from tpuserve.bench.slo_search import DEFAULT_ATTAINMENT, search_max_rate
from tpuserve_router.config import DEFAULT_POLICY

log = logging.getLogger(__name__)

DESCRIPTION = """Benchmark a routing policy on a workload, in-process (sim) or over HTTP (live).

Mode sim drives the router's policy objects (or an anchor: sglang-router cache_aware v1/v2,
llm-d's approximate scorer, Dynamo's cost function, Preble E2, the oracle) in front of N
engine twins on a virtual clock: 10^5 requests take seconds. Mode live starts N
`tpuserve engine sim` processes with time dilation and a router in front of them (`tpuserve
router`, or the real sglang-router for --policy sglang_cache_aware_v2) and sends the trace
over HTTP from loopback.

Without --cache-tokens each worker's KV pool is sized from the trace (shared-prefix demand
= 3-6 x one worker, about 0.7 x the fleet). Without --rate the trace is replayed at
--rate-fraction (default 0.85) x mu_RR, round-robin's saturation throughput measured in sim mode.

examples:
  tpuserve bench --workload W2 --json
  tpuserve bench --workload W5 --policy sglang_cache_aware_v1 --rate-fraction 1.0 --json
  tpuserve bench --workload W8 --fault restart --fault-at 60 --json
  tpuserve bench --workload W1 --write-trace w1.jsonl --requests 500
  tpuserve bench --trace w1.jsonl --mode live --policy cache_aware --json
"""


def _key_value(value: str) -> tuple[str, float]:
    key, sep, raw = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=NUMBER")
    try:
        return key, float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: {raw!r} is not a number") from None


def _workload(value: str) -> str:
    if value not in workloads.WORKLOADS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not allowed; allowed: {', '.join(workloads.WORKLOADS)}"
        )
    return value


def _policy(value: str) -> str:
    names = policy_names()
    if value not in names:
        raise argparse.ArgumentTypeError(f"{value!r} is not allowed; allowed: {', '.join(names)}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("what to send")
    which = src.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--workload", type=_workload, help=f"One of {', '.join(workloads.WORKLOADS)}."
    )
    which.add_argument("--trace", help="A JSON Lines trace file (ours, or Mooncake's format).")
    src.add_argument(
        "--requests", type=cli_types.positive_int, default=None,
        help="Requests to generate (default: the workload's, at least 2,000 measured).",
    )  # fmt: skip
    src.add_argument(
        "--seed",
        type=cli_types.non_negative_int,
        default=0,
        help="Workload and policy seed (default: 0).",
    )
    src.add_argument(
        "--workload-param", type=_key_value, action="append", default=[], metavar="KEY=NUMBER",
        help="Override a workload parameter (e.g. zipf=1.0 for W1).",
    )  # fmt: skip
    src.add_argument(
        "--write-trace", metavar="FILE", help="Also write the trace that is replayed to FILE."
    )
    rate = src.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=cli_types.positive_float, help="Mean arrivals per second.")
    rate.add_argument(
        "--rate-fraction", type=cli_types.positive_float, default=None,
        help="Mean arrival rate as a fraction of mu_RR (default: 0.85).",
    )  # fmt: skip
    src.add_argument(
        "--mu-rr", type=cli_types.positive_float, default=None,
        help="Use this mu_RR (requests/s) instead of measuring it.",
    )  # fmt: skip
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--policy", type=_policy, default=DEFAULT_POLICY,
        help=f"Routing policy (default: the router's default, {DEFAULT_POLICY}): "
        f"{', '.join(policy_names())}.",
    )  # fmt: skip
    fleet.add_argument("--mode", choices=("sim", "live"), default="sim", help="(default: sim)")
    fleet.add_argument(
        "--workers", type=cli_types.positive_int, default=4, help="Engines (default: 4)."
    )
    fleet.add_argument(
        "--cache-tokens", type=cli_types.positive_int, default=None,
        help="KV pool per engine in tokens (default: sized from the trace).",
    )  # fmt: skip
    fleet.add_argument(
        "--router-replicas", type=cli_types.positive_int, default=1,
        help="Router replicas behind one Service (sim): each request goes to one at random; "
        "each keeps its own policy state and in-flight counts (default: 1).",
    )  # fmt: skip
    fleet.add_argument(
        "--peer-delay", type=cli_types.non_negative_float, default=None,
        help="Router replicas of a tpuserve policy peer as tpuserve router --peer-port does, "
        "each hearing the others' decisions this many seconds late (sim; default: no peering, "
        "the engine load poll only).",
    )  # fmt: skip
    fleet.add_argument(
        "--kv-event-interval", type=cli_types.non_negative_float, default=0.0,
        help="Each router replica reads the engines' KV events every this many seconds, as "
        "tpuserve router reads busy streams (sim; default: 0, at once).",
    )  # fmt: skip
    fleet.add_argument(
        "--host-cache-tokens", type=cli_types.non_negative_int, default=0,
        help="Each engine's host-memory KV tier in tokens (SGLang's HiCache, write-through; "
        "sim; default: 0, HBM only).",
    )  # fmt: skip
    fleet.add_argument(
        "--tier-blind", action="store_true",
        help="The router ignores the KV events' medium, as routers before tiers did: a block "
        "demoted to host memory is forgotten (sim).",
    )  # fmt: skip
    fleet.add_argument("--page-size", type=cli_types.positive_int, default=16, help="(default: 16)")
    fleet.add_argument("--tpu", default="v6e", choices=generation_names(), help="(default: v6e)")
    fleet.add_argument("--topology", default="1x1", help="TPU slice shape (default: 1x1).")
    fleet.add_argument(
        "--model-profile", default=perf_model.DEFAULT_PROFILE,
        help=f"(default: %(default)s) one of {', '.join(perf_model.profile_names())}",
    )  # fmt: skip
    faults = parser.add_argument_group("faults (W8c/d/e)")
    faults.add_argument("--fault", choices=("restart", "flush"), help="Inject one fault.")
    faults.add_argument(
        "--fault-at", type=cli_types.non_negative_float, default=None,
        help="Seconds into the (rescaled) trace (default: its middle).",
    )  # fmt: skip
    faults.add_argument(
        "--fault-worker",
        type=cli_types.non_negative_int,
        default=0,
        help="Worker index (default: 0).",
    )
    faults.add_argument(
        "--restart-down-seconds", type=cli_types.non_negative_float, default=5.0,
        help="How long a restarted worker is unroutable (default: 5).",
    )  # fmt: skip
    faults.add_argument(
        "--no-kv-events", action="store_true",
        help="Policies with a block index get no KV events (a router run with --no-kv-events).",
    )  # fmt: skip
    faults.add_argument(
        "--kv-event-drop", type=cli_types.fraction, default=0.0,
        help="Share of KV-event batches lost before they reach the policy (sim; default 0).",
    )  # fmt: skip
    out = parser.add_argument_group("measurement")
    out.add_argument(
        "--warmup-fraction", type=cli_types.fraction, default=0.1,
        help="Leading share of requests not measured (default: 0.1).",
    )  # fmt: skip
    out.add_argument(
        "--slo-factor", type=cli_types.positive_float, default=SLO_FACTOR,
        help="Goodput SLO: TTFT and TPOT within this many x unloaded (default: %(default)s).",
    )  # fmt: skip
    out.add_argument(
        "--max-rate-at-slo", action="store_true",
        help="Goodput as a rate (sim): replay the trace at rising rates from --rate (default "
        "0.5 x mu_RR), x1.25 until fewer than --attainment of the measured requests meet the "
        "SLO, then bisect to 1 %%; report the run at the highest rate that met it, and every "
        "rate tried (slo_search). Same seed, same arrivals up to scale, for every setup.",
    )  # fmt: skip
    out.add_argument(
        "--attainment", type=cli_types.fraction, default=DEFAULT_ATTAINMENT,
        help="With --max-rate-at-slo: share of requests that must meet the SLO "
        "(default: %(default)s, DistServe's).",
    )  # fmt: skip
    out.add_argument("--records", metavar="FILE", help="Write per-request records (JSONL).")
    out.add_argument("--json", action="store_true", help="Print one JSON object.")
    live = parser.add_argument_group("live mode")
    live.add_argument(
        "--time-scale", type=cli_types.positive_float, default=1.0,
        help="Engine time dilation: real seconds per modelled second (default: 1).",
    )  # fmt: skip
    live.add_argument(
        "--anchor-python", default=None,
        help="Python of the venv holding sglang-router (default: bench/routing_anchor_venv.sh).",
    )  # fmt: skip


def load_trace(args: argparse.Namespace) -> tuple[list[traces.TraceRequest], str]:
    if args.trace:
        trace = traces.read_trace(args.trace)
        if args.requests:
            trace = trace[: args.requests]
        return trace, args.trace
    params = dict(args.workload_param)
    return workloads.generate(args.workload, args.seed, args.requests, **params), args.workload


def run(args: argparse.Namespace) -> int:
    from tpuserve.bench.live_runner import LiveError

    try:
        return _run(args)
    except (traces.TraceError, ValueError, CatalogError, LiveError) as err:
        print(f"tpuserve bench: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    lookup(args.tpu, args.topology)
    perf_model.get_profile(args.model_profile)
    if args.fault_at is not None and args.fault is None:
        raise ValueError("--fault-at: needs --fault restart|flush")
    if args.fault and args.mode == "live":
        raise ValueError("--fault: faults are injected in --mode sim only")
    if args.router_replicas > 1 and args.mode == "live":
        raise ValueError("--router-replicas: more than one replica runs in --mode sim only")
    if args.peer_delay is not None and args.mode == "live":
        raise ValueError("--peer-delay: peering replicas run in --mode sim only")
    if (args.host_cache_tokens or args.tier_blind) and args.mode == "live":
        raise ValueError("--host-cache-tokens, --tier-blind: the host tier runs in --mode sim only")
    if args.kv_event_interval and args.mode == "live":
        raise ValueError("--kv-event-interval: the live router reads as it does; sim only")
    if args.max_rate_at_slo and (args.mode == "live" or args.fault):
        raise ValueError("--max-rate-at-slo: runs in --mode sim, without --fault")
    if args.max_rate_at_slo and args.rate_fraction is not None:
        raise ValueError("--max-rate-at-slo: give the first rate as --rate, not --rate-fraction")
    trace, source = load_trace(args)
    demand = sizing.measure_demand(trace, args.page_size)
    cache_tokens = args.cache_tokens or sizing.cache_tokens_for(demand, args.workers)
    config = SimConfig(
        workers=args.workers, cache_tokens=cache_tokens, page_size=args.page_size, tpu=args.tpu,
        topology=args.topology, model_profile=args.model_profile, seed=args.seed,
        kv_event_drop=args.kv_event_drop, slo_factor=args.slo_factor,
        restart_down_seconds=args.restart_down_seconds, kv_events=not args.no_kv_events,
        router_replicas=args.router_replicas, peer_delay_seconds=args.peer_delay,
        kv_event_interval_seconds=args.kv_event_interval,
        host_cache_tokens=args.host_cache_tokens, kv_tiers=not args.tier_blind,
    )  # fmt: skip
    config.validate()
    mu_rr = args.mu_rr
    if args.max_rate_at_slo:
        return _max_rate_at_slo(args, trace, source, config, demand.shared_tokens, mu_rr)
    if args.rate is not None:
        rate = args.rate
        fraction = None
    else:
        fraction = args.rate_fraction if args.rate_fraction is not None else 0.85
        if mu_rr is None:
            mu_rr = measure_rr_saturation(trace, config)
        rate = fraction * mu_rr
    trace = traces.rescale_to_rate(trace, rate)
    if args.write_trace:
        traces.write_trace(trace, args.write_trace)
    fault_at = None
    if args.fault:
        fault_at = args.fault_at if args.fault_at is not None else trace[len(trace) // 2].t
        config = replace(config, faults=(Fault(args.fault, fault_at, args.fault_worker),))
        config.validate()
    extra: dict[str, Any] = {
        "mode": args.mode, "workload": source, "seed": args.seed, "workers": args.workers,
        "cache_tokens": cache_tokens, "shared_prefix_tokens": demand.shared_tokens,
        "rate": rate, "rate_fraction": fraction, "mu_rr": mu_rr,
        "tpu": f"{args.tpu}-{args.topology}", "model_profile": args.model_profile,
        "kv_events": not args.no_kv_events, "router_replicas": args.router_replicas,
        "peer_delay_seconds": args.peer_delay, "kv_event_interval_seconds": args.kv_event_interval,
        "host_cache_tokens": args.host_cache_tokens, "tier_blind": args.tier_blind,
    }  # fmt: skip
    fault_log: list[dict[str, Any]] = []
    if args.mode == "sim":
        result = run_sim(trace, args.policy, config)
        records = result.records
        fault_log = result.faults
        extra["wall_seconds"] = result.wall_seconds
        extra["virtual_seconds"] = result.virtual_seconds
        summary = summarize(
            args.policy, records, result.samples, warmup_fraction=args.warmup_fraction,
            slo_factor=args.slo_factor, extra=extra,
        )  # fmt: skip
    else:
        from tpuserve.bench.live_runner import LiveConfig, run_live

        live = run_live(
            trace, args.policy,
            LiveConfig(sim=config, time_scale=args.time_scale, anchor_python=args.anchor_python),
        )  # fmt: skip
        records = live.records
        extra.update(live.meta)
        summary = summarize(
            args.policy, records, live.samples, warmup_fraction=args.warmup_fraction,
            time_unit=args.time_scale, slo_factor=args.slo_factor, extra=extra,
        )  # fmt: skip
    if fault_at is not None:
        summary["fault"] = fault_summary(args, records, fault_log[0] if fault_log else {})
    if args.records:
        with open(args.records, "w") as f:
            for r in records:
                f.write(json.dumps({
                    "id": r.id, "worker": r.worker, "arrival": r.arrival, "outcome": r.outcome,
                    "ttft": r.ttft, "e2e": r.e2e, "prompt_tokens": r.prompt_tokens,
                    "cached_tokens": r.cached_tokens, "completion_tokens": r.completion_tokens,
                    "ok": r.succeeded, "error": r.failure_reason,
                    "error_detail": r.error_detail,
                }) + "\n")  # fmt: skip
    if args.json:
        print(json.dumps(_finite(summary)))
    else:
        print(render_text(summary))
    return 0


def _base_extra(
    args: argparse.Namespace, source: str, cache_tokens: int, shared_tokens: int
) -> dict[str, Any]:
    return {
        "mode": args.mode, "workload": source, "seed": args.seed, "workers": args.workers,
        "cache_tokens": cache_tokens, "shared_prefix_tokens": shared_tokens,
        "tpu": f"{args.tpu}-{args.topology}", "model_profile": args.model_profile,
        "kv_events": not args.no_kv_events, "router_replicas": args.router_replicas,
        "peer_delay_seconds": args.peer_delay, "kv_event_interval_seconds": args.kv_event_interval,
        "host_cache_tokens": args.host_cache_tokens, "tier_blind": args.tier_blind,
    }  # fmt: skip


def _max_rate_at_slo(
    args: argparse.Namespace,
    trace: list[traces.TraceRequest],
    source: str,
    config: SimConfig,
    shared_tokens: int,
    mu_rr: float | None,
) -> int:
    """`--max-rate-at-slo` (`slo_search`): the summary at the highest rate that met the SLO
    for ``--attainment`` of the requests, with every rate tried."""
    if args.rate is not None:
        start = args.rate
    else:
        if mu_rr is None:
            mu_rr = measure_rr_saturation(trace, config)
        start = 0.5 * mu_rr
    base = _base_extra(args, source, config.cache_tokens, shared_tokens)

    def run_at(rate: float) -> dict[str, Any]:
        result = run_sim(traces.rescale_to_rate(trace, rate), args.policy, config)
        extra = dict(base, rate=rate, rate_fraction=None, mu_rr=mu_rr)
        extra["virtual_seconds"] = result.virtual_seconds
        return summarize(
            args.policy, result.records, result.samples, warmup_fraction=args.warmup_fraction,
            slo_factor=args.slo_factor, extra=extra,
        )  # fmt: skip

    found = search_max_rate(run_at, start, attainment=args.attainment)
    summary = dict(found.best) if found.best is not None else dict(base, mu_rr=mu_rr)
    summary["slo_search"] = found.record(args.slo_factor, start)
    if args.json:
        print(json.dumps(_finite(summary)))
    else:
        print(render_text(summary))
        print(f"  {'max_rate_at_slo':<24} {found.max_rate:.4g} (attainment {found.attainment})")
    return 0


def fault_summary(
    args: argparse.Namespace, records: list[RequestRecord], fault: dict[str, Any]
) -> dict[str, Any]:
    """Hit-rate recovery after the fault, from the moment the engine serves again (a restarted
    engine after --restart-down-seconds, a flushed one once drained and flushed)."""
    fault_at = fault.get("at")
    back_at = fault.get("serving_again_at")
    out: dict[str, Any] = {
        "kind": args.fault, "at": fault_at, "serving_again_at": back_at,
        "worker": args.fault_worker,
    }  # fmt: skip
    if fault_at is None or back_at is None:
        out["faulted_worker"] = out["fleet"] = {"recovery_seconds": None}
        return out
    worker = sorted({r.worker for r in records if r.worker})[args.fault_worker :][:1]
    out["faulted_worker"] = recovery_seconds(
        records, back_at, worker=worker[0] if worker else None, pre_fault_at=fault_at
    )
    out["fleet"] = recovery_seconds(records, back_at, pre_fault_at=fault_at)
    return out


def _finite(value: Any) -> Any:
    """JSON has no NaN: report missing statistics as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def render_text(summary: dict[str, Any]) -> str:
    lines = [f"policy {summary['policy']} on {summary.get('workload')} ({summary.get('mode')})"]
    for key in (
        "requests", "failed", "failed_by_reason", "hit_rate", "ttft_mean", "ttft_p50",
        "ttft_p90", "ttft_p99", "e2e_mean", "e2e_p99", "throughput_rps", "output_tokens_per_s",
        "goodput_rps", "imbalance_max_over_mean", "rate", "mu_rr", "cache_tokens",
    ):  # fmt: skip
        value = summary.get(key)
        if isinstance(value, float):
            shown = f"{value:.4g}"
        elif isinstance(value, dict):
            shown = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
        else:
            shown = str(value)
        lines.append(f"  {key:<24} {shown}")
    return "\n".join(lines)
