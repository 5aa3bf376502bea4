"""Seeded figures pinned to the code: golden files, and the docs tables made from results files.

Two kinds of pin, both checked by ``tests/unit/bench/test_goldens.py``:

- **Reduced seeded runs** (``FIGURES``): each published seeded simulation (the fleet hour, the
  tokens-per-day table, `tpuserve plan`, the PD benchmark) is rerun here on a configuration
  small enough for a test (seconds), through the same code, and its figures are compared with
  ``tests/goldens/<name>.json``. A change that moves the simulation moves these, and the test
  fails until the goldens are rewritten on purpose.
- **Docs tables** (``TABLES``): the published tables in docs/capacity-planning.md (the fleet
  hour, tokens per day, the three `tpuserve plan` cases, the fleet model against the twin,
  the autoscalers' day) and docs/pd.md sit between
  ``<!-- golden:NAME:begin -->`` and ``<!-- golden:NAME:end -->`` and are rendered from the
  committed results files of the full runs (``bench/fleet_results/``, ``bench/pd_results/``),
  so a page cannot say other than its results file.

One command rewrites both (the goldens from the reduced runs, the tables from the results
files)::

    .venv/bin/python bench/goldens.py --write

With ``--full`` it first reruns the published full configurations into the results files
(the fleet hour twice, ~3 min each; the tokens-per-day day, ~1 h with 2 jobs; the PD
benchmark, ~1 min a workload; the three `tpuserve plan` cases with ``--verify``, a few CPU
minutes each), then does the same. ``--check`` (the default) compares
without writing and exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = ROOT / "tests" / "goldens"
FLEET_RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-06"
PLAN_RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-07"
BEHAVIOR_RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-07b"
RULES_RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-07c"
BURSTY_RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-07d"
MANY_MODELS_RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-07e"
PD_RESULTS = ROOT / "bench" / "pd_results"
ROUTER_RESULTS = ROOT / "bench" / "router_results"
AUTOSCALING_LOG = ROOT / "bench" / "fleet_results" / "README.md"
"""The autoscaler experiments' log (its tables are generated like the pages')."""
ANCHOR = "sglang-router 0.3.2 cache_aware"
PD_DATE = "2026-12-06"
PD_WORKLOADS = ("W9", "W10", "10k1k", "W1", "W2")
REL_TOL = 1e-9
"""The runs are seeded and single-threaded: the same code gives the same floats."""


def _bench_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_goldens_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _without_wall(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


# ---- reduced seeded runs ------------------------------------------------------------------


def fleet_hour_small() -> dict[str, Any]:
    """bench/fleet_hour.py's path (autoscaler, cold starts, Spot, peering routers), 12 slots."""
    from tpuserve.fleet import FleetConfig, run_fleet

    config = FleetConfig(
        policy="precise", replicas=12, initial_replicas=8, min_replicas=2, router_replicas=2,
        peak_rate=25.0, start_hour=14.0, duration_seconds=240.0, autoscale=True,
        target_tokens_per_chip=50_000.0, preemptions_per_replica_hour=6.0,
        cold_start_seconds=(30.0, 60.0), seed=0,
    )  # fmt: skip
    return {"config": config.as_dict(), "summary": _without_wall(run_fleet(config).summary())}


def tokens_per_day_small() -> dict[str, Any]:
    """bench/fleet_tokens_per_day.py's day (three weighted windows, four policies, 1 and 4
    routers) on 8 replica slots and 60-s windows, demand scaled to the fleet."""
    tpd = _bench_module("fleet_tokens_per_day")
    args = argparse.Namespace(
        overload=1.2, capacity=tpd.PLANNED_CAPACITY_PER_REPLICA, bursts_per_hour=6.0,
        window=60.0, warmup=15.0, ttft=5.0, itl=0.1, seed=0, peer_delay=0.001, no_peering=False,
        policies=list(tpd.POLICIES), routers=[1, 4], rows=None,
    )  # fmt: skip
    replicas = 8
    work = [
        (replace(c, replicas=replicas, peak_rate=c.peak_rate * replicas / 250), h, w, None)
        for c, h, w, _ in tpd.jobs(args)
    ]
    rows = [tpd.run_one(j) for j in work]
    table = tpd.aggregate(rows)
    for t in table:
        for window in t["windows"].values():
            window.pop("wall_seconds", None)
    return {"replicas": replicas, "window": args.window, "warmup": args.warmup, "table": table}


def plan_small() -> dict[str, Any]:
    """`tpuserve plan`'s search and its --verify at full size, on a chat case with two slices."""
    from tpuserve.plan import cli
    from tpuserve.plan.planner import plan, verify

    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args([
        "--model", "llama-3.1-8b", "--preset", "chat", "--rate", "20", "--ttft-p99", "2",
        "--itl-p99", "0.1", "--generations", "v6e", "--topologies", "1x1,2x2",
        "--sim-replicas", "2", "--window", "60", "--verify",
    ])  # fmt: skip
    inputs, _ = cli.build_inputs(args)
    result = plan(inputs, None)
    if result.best is not None:
        result.verified = verify(result)
    out: dict[str, Any] = json.loads(json.dumps(cli.to_json(result), default=str))
    return out


def pd_small() -> dict[str, Any]:
    """bench/pd_disaggregation.py (capacity search, split, three modes, two loads) on W1 and
    W10 with 80 requests each."""
    pdd = _bench_module("pd_disaggregation")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pd.json"
        argv = ["--workloads", "W1,W10", "--requests", "80", "--json", str(out)]
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            pdd.main(argv)
        data: dict[str, Any] = json.loads(out.read_text())
    return data


FIGURES: dict[str, Callable[[], dict[str, Any]]] = {
    "fleet_hour": fleet_hour_small,
    "tokens_per_day": tokens_per_day_small,
    "plan": plan_small,
    "pd_disaggregation": pd_small,
}


def golden_path(name: str) -> Path:
    return GOLDENS / f"{name}.json"


VOLATILE = frozenset({"wall_seconds"})
"""Keys that measure the machine, not the model: left out of every golden."""


def _normalise(value: Any) -> Any:
    """JSON's view of a value (tuples as lists, NaN kept as NaN), without ``VOLATILE`` keys."""

    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in VOLATILE}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(json.loads(json.dumps(value, default=str)))


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where two JSON values differ (floats within ``REL_TOL``; NaN equals NaN)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for key in sorted(set(expected) | set(actual), key=str):
            if key not in expected or key not in actual:
                out.append(f"{path}/{key}: only in {'golden' if key in expected else 'run'}")
            else:
                out += differences(expected[key], actual[key], f"{path}/{key}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(expected)} items in the golden, {len(actual)} in the run"]
        pairs = enumerate(zip(expected, actual, strict=True))
        return [d for i, (e, a) in pairs for d in differences(e, a, f"{path}[{i}]")]
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, bool) or isinstance(actual, bool):
            return [] if expected == actual else [f"{path}: {expected!r} -> {actual!r}"]
        if isinstance(expected, int | float) and isinstance(actual, int | float):
            e, a = float(expected), float(actual)
            if (math.isnan(e) and math.isnan(a)) or math.isclose(e, a, rel_tol=REL_TOL):
                return []
    elif expected == actual:
        return []
    return [f"{path}: {expected!r} -> {actual!r}"]


# ---- docs tables from the results files --------------------------------------------------


def _fleet_hour_row(label: str, s: dict[str, Any]) -> str:
    finished = " (all finished)" if s["completed"] == s["requests"] else ""
    return (
        f"| {label} | {s['requests']:,}{finished} | {s['events'] / 1e6:.2f} M "
        f"| {s['tokens_per_second'] / 1e6:.2f} M "
        f"({s['output_tokens_per_second'] / 1e3:.0f} k output) "
        f"| {s['cache_hit_rate']:.2f} | {s['ttft_p50']:.3f} / {s['ttft_p99']:.2f} s "
        f"| {s['itl_p50'] * 1e3:.0f} / {s['itl_p99'] * 1e3:.0f} ms "
        f"| {s['replicas_min']}-{s['replicas_max']} ({s['mean_chips']:.0f} chips on average) "
        f"| {s['preemptions']} | {s['scale_ups']} / {s['scale_downs']} |"
    )


def fleet_hour_table() -> str:
    peering = json.loads((FLEET_RESULTS / "fleet_hour.json").read_text())["summary"]
    alone = json.loads((FLEET_RESULTS / "fleet_hour.no-peering.json").read_text())["summary"]
    return "\n".join([
        "| simulated | requests | events | tokens/s | hit rate | TTFT p50 / p99 | ITL p50 / p99 "
        "| replicas | preemptions | scale ups / downs |",
        "|---|---|---|---|---|---|---|---|---|---|",
        _fleet_hour_row(f"{peering['window_seconds']:,.0f} s", peering),
        _fleet_hour_row("the same, `--no-peering`", alone),
    ])  # fmt: skip


POLICY_LABELS = {"precise": "precise (default)", "llmd": "llmd (anchor)"}


def tokens_per_day_table() -> str:
    """The table of bench/fleet_tokens_per_day.py's report, in the page's words."""
    tpd = _bench_module("fleet_tokens_per_day")
    data = json.loads((FLEET_RESULTS / "fleet_tokens_per_day.json").read_text())
    lines = tpd.report(data).split("\n\n", 1)[0].splitlines()
    lines[0] = (
        lines[0]
        .replace("tokens/day (B)", "tokens/day (10^9)")
        .replace("goodput tokens/day (B)", "goodput tokens/day (10^9)")
    )
    lines[0] = lines[0].replace("| vs llmd |", "| vs llm-d |")
    out = lines[:2]
    for line in lines[2:]:
        cells = line.split(" | ")
        policy = cells[0].removeprefix("| ")
        out.append("| " + POLICY_LABELS.get(policy, policy) + " | " + " | ".join(cells[1:]))
    return "\n".join(out)


PLAN_CASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("chat", "chat, 100 req/s at the peak",
     ("--model", "llama-3.1-8b", "--preset", "chat", "--rate", "100", "--ttft-p99", "1",
      "--itl-p99", "0.05", "--generations", "v6e,v5e", "--name", "chat-plan")),
    ("long-document",
     "long documents (Qwen3-8B, 7k-token documents, 90 % shared), 20 req/s",
     ("--model", "qwen3-8b", "--preset", "long-document", "--rate", "20", "--ttft-p99", "2",
      "--itl-p99", "0.05", "--generations", "v6e,v5e", "--name", "docs-plan")),
    ("tokens-per-day",
     "agentic (Mooncake tool&agent shape), 6 x 10^9 tokens/day = {peak:.1f} req/s at the peak",
     ("--model", "llama-3.1-8b", "--preset", "agentic", "--tokens-per-day", "6e9",
      "--ttft-p99", "5", "--itl-p99", "0.1", "--generations", "v6e", "--name", "agent-plan")),
)  # fmt: skip
"""The three `tpuserve plan` cases of docs/capacity-planning.md: results name, label, flags
(each also run with ``--verify --json --emit plan-NAME.yaml``)."""


def _slice(name: str) -> str:
    generation, topology = name.split(" ", 1)
    return f"{generation} `{topology}`"


def plan_table() -> str:
    """docs/capacity-planning.md's three-case table from the plans' JSON (`--json`)."""
    lines = [
        "| case | choice | capacity per replica | p99 TTFT / ITL at capacity "
        "| $/1M output (on-demand) | runner-up | predicted vs measured at full size |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label, _ in PLAN_CASES:
        data = json.loads((PLAN_RESULTS / f"plan-{name}.json").read_text())
        by_slice = {c["slice"]: c for c in data["candidates"]}
        best = by_slice[data["choice"]]
        low = max(1, math.ceil(best["replicas"] * data["trough"]))
        scaling = f", autoscaling {low}-{best['replicas']}" if low < best["replicas"] else ""
        runner = by_slice[data["ranked"][1]] if len(data["ranked"]) > 1 else None
        runner_up = (
            f"{_slice(runner['slice'])} x {runner['replicas']}, "
            f"${runner['usd_per_million_output_tokens']:.3f}"
            if runner else "–"
        )  # fmt: skip
        v = data["verified"]
        lo, hi = v["measured_within"]
        lines.append(
            f"| {label.format(peak=data['peak_rate'])} "
            f"| {best['replicas']} x {_slice(best['slice'])} ({best['chips']} chips){scaling} "
            f"| {best['capacity_rps_per_replica']:.2f} req/s "
            f"| {best['ttft_p99']:.2f} s / {best['itl_p99'] * 1e3:.0f} ms "
            f"| ${best['usd_per_million_output_tokens']:.3f} | {runner_up} "
            f"| {v['predicted_rps']:.1f} vs {v['measured_rps']:.1f} req/s, the limit in "
            f"[{lo:.1f}, {hi:.1f}) ({v['ratio']:.2f}) |"
        )
    return "\n".join(lines)


def autoscaling_day_table() -> str:
    """bench/autoscaling_day.py's report table of its latest committed day (2026-12-07: the
    2026-12-06 rows and the predictive floor holding the last hour's peak)."""
    day = _bench_module("autoscaling_day")
    data = json.loads((PLAN_RESULTS / "autoscaling_day.json").read_text())
    table: str = day.report(data).split("\n\n", 1)[0].strip()
    return table


def autoscaling_day_split_table() -> str:
    """bench/autoscaling_day.py --split of the same file: violation minutes by the ceiling."""
    day = _bench_module("autoscaling_day")
    data = json.loads((PLAN_RESULTS / "autoscaling_day.json").read_text())
    return str(day.split_report(data))


def many_models_table() -> str:
    """bench/fleet_many_models.py's table of its committed runs (issue 70's hundred models)."""
    many = _bench_module("fleet_many_models")
    data = json.loads((MANY_MODELS_RESULTS / "many_models.json").read_text())
    return str(many.report(data["runs"]))


def autoscaling_report_and_split(path: Path) -> Callable[[], str]:
    """bench/autoscaling_day.py's report and --split tables of one committed run: the
    1,000-chip run, those comparing scaling behaviours (2026-12-07b,
    `tpuserve_operator.scaling_behavior`) and those with Kubernetes' HPA rule and the floor's
    median trend (2026-12-07c), and the 1,000-chip bursty day (2026-12-07d)."""

    def render() -> str:
        day = _bench_module("autoscaling_day")
        data = json.loads(path.read_text())
        return f"{day.report(data)}\n\n{day.split_report(data)}"

    return render


def fleet_vs_twin_table() -> str:
    """bench/fleet_vs_twin.py's rows (fleet model against the token-level twin)."""
    lines = [
        "| req/s | TTFT p50 twin / fleet (ms) | TTFT p99 twin / fleet (ms) "
        "| mean ITL twin / fleet (ms) | output tok/s twin / fleet |",
        "|---|---|---|---|---|",
    ]
    for line in (FLEET_RESULTS / "fleet_vs_twin.jsonl").read_text().splitlines():
        r = json.loads(line)
        t, f = r["twin"], r["fleet"]
        lines.append(
            f"| {r['rate']:.0f} | {t['ttft_p50'] * 1e3:.1f} / {f['ttft_p50'] * 1e3:.1f} "
            f"| {t['ttft_p99'] * 1e3:.1f} / {f['ttft_p99'] * 1e3:.1f} "
            f"| {t['tpot_mean'] * 1e3:.1f} / {f['tpot_mean'] * 1e3:.1f} "
            f"| {t['output_tokens_per_s']:,.0f} / {f['output_tokens_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def _rate(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def pd_table() -> str:
    lines = [
        "| workload | load | mode | P:D:C | pairs | p99 TTFT s | p99 ITL ms | p99.9 ITL ms "
        "| goodput req/s | good |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload in PD_WORKLOADS:
        data = json.loads((PD_RESULTS / f"{PD_DATE}-{workload}.json").read_text())
        for r in data["results"]:
            p = r["pools"]
            load = f"×{r['load']:g}"
            if r["mode"] == "colocated":
                load += f", {_rate(r['rate_rps'])} req/s"
            lines.append(
                f"| {r['workload']} | {load} | {r['mode']} "
                f"| {p['prefill']}:{p['decode']}:{p['colocated']} | {r['disaggregated']} "
                f"| {r['p99_ttft_s']:.2f} | {r['p99_itl_s'] * 1e3:.1f} "
                f"| {r['p999_itl_s'] * 1e3:.0f} | {r['goodput_rps']:.3f} | {r['good_share']:.2f} |"
            )
    return "\n".join(lines)


def _anchor_row(run: dict[str, Any]) -> dict[str, Any]:
    rows = json.loads((ROUTER_RESULTS / run["results"]).read_text())
    found = [r for r in rows if r["against"] == ANCHOR]
    if len(found) != 1:
        raise ValueError(f"{run['results']}: {len(found)} rows against {ANCHOR}, need 1")
    row: dict[str, Any] = found[0]
    return row


def _ratio(row: dict[str, Any]) -> str:
    lo, hi = row["paired_ratio_ci95"]
    return f"{row['paired_ratio']:.3f}× [{lo:.3f}-{hi:.3f}]"


def router_cpu_headline() -> str:
    """The router's CPU per request against sglang-router `cache_aware` (docs/router.md and
    docs/benchmarks.md): the first run of ``bench/router_results/headline.json`` from its
    results file, then the earlier ones. A new measurement goes in by adding its run at the
    top of that file and running ``bench/goldens.py --write``."""
    runs = json.loads((ROUTER_RESULTS / "headline.json").read_text())["runs"]
    head, earlier = runs[0], runs[1:]
    row = _anchor_row(head)
    folder = Path(head["results"]).parent.as_posix()
    lines = [
        "The default policy (`precise` + KV events) against sglang-router 0.3.2 `cache_aware`, "
        f"CPU per request, same run, paired rounds, as last measured ({head['commit']}, "
        f"{head['what']}; {head['date']}; {head['engines']}, {len(row['rounds'])} rounds of "
        f"{head['requests']:,} requests at {head['rate']:g}/s, load average {head['load']}; "
        f"`bench/router_results/{folder}/`): **{_ratio(row)}** "
        f"({row['cpu_us_per_request']:.0f} against {row['against_us_per_request']:.0f} µs).",
    ]
    if earlier:
        lines.append(
            "Earlier runs, same conditions: "
            + "; ".join(
                f"{r['commit']} ({r['what']}, {r['date']}, load average {r['load']}) "
                f"{_ratio(_anchor_row(r))}"
                for r in earlier
            )
            + "."
        )
    lines += ["", "```", head["command"], "```"]
    return "\n".join(lines)


@dataclass(frozen=True)
class Table:
    page: Path
    render: Callable[[], str]
    block: str = ""
    """The block's name in the page when not the table's key (one figure on several pages)."""


TABLES: dict[str, Table] = {
    "fleet-hour": Table(ROOT / "docs" / "capacity-planning.md", fleet_hour_table),
    "tokens-per-day": Table(ROOT / "docs" / "capacity-planning.md", tokens_per_day_table),
    "plan-cases": Table(ROOT / "docs" / "capacity-planning.md", plan_table),
    "fleet-vs-twin": Table(ROOT / "docs" / "capacity-planning.md", fleet_vs_twin_table),
    "autoscaling-day": Table(AUTOSCALING_LOG, autoscaling_day_table),
    "autoscaling-day-split": Table(AUTOSCALING_LOG, autoscaling_day_split_table),
    "autoscaling-day-1000": Table(
        AUTOSCALING_LOG,
        autoscaling_report_and_split(PLAN_RESULTS / "autoscaling_day.1000chips.json"),
    ),
    "autoscaling-behavior-100": Table(
        AUTOSCALING_LOG,
        autoscaling_report_and_split(BEHAVIOR_RESULTS / "autoscaling_day.100chips.json"),
    ),
    "autoscaling-behavior-1000": Table(
        AUTOSCALING_LOG,
        autoscaling_report_and_split(BEHAVIOR_RESULTS / "autoscaling_day.1000chips.json"),
    ),
    "autoscaling-rules-100": Table(
        AUTOSCALING_LOG,
        autoscaling_report_and_split(RULES_RESULTS / "autoscaling_day.100chips.json"),
    ),
    "autoscaling-rules-1000": Table(
        AUTOSCALING_LOG,
        autoscaling_report_and_split(RULES_RESULTS / "autoscaling_day.1000chips.json"),
    ),
    "autoscaling-bursty-1000": Table(
        AUTOSCALING_LOG,
        autoscaling_report_and_split(BURSTY_RESULTS / "autoscaling_day.1000chips.bursty.json"),
    ),
    "pd-disaggregation": Table(ROOT / "docs" / "pd.md", pd_table),
    "many-models": Table(ROOT / "docs" / "capacity-planning.md", many_models_table),
    "router-cpu": Table(ROOT / "docs" / "router.md", router_cpu_headline),
    "router-cpu-benchmarks": Table(
        ROOT / "docs" / "benchmarks.md", router_cpu_headline, block="router-cpu"
    ),
}


def block_name(name: str) -> str:
    """The name of table ``name``'s block in its page."""
    return TABLES[name].block or name


def block(text: str, name: str) -> str:
    """The generated block `name` of a page (between its markers, without them)."""
    begin, end = f"<!-- golden:{name}:begin -->\n", f"\n<!-- golden:{name}:end -->"
    _, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"no {begin.strip()} ... {end.strip()} block")
    return rest.split(end, 1)[0]


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- golden:{name}:begin -->\n", f"\n<!-- golden:{name}:end -->"
    old = block(text, name)
    return text.replace(begin + old + end, begin + body + end, 1)


# ---- the full published runs (--full) -----------------------------------------------------

FULL_RUNS: tuple[tuple[str, ...], ...] = (
    ("bench/fleet_hour.py", "--json-out", f"{FLEET_RESULTS.relative_to(ROOT)}/fleet_hour.json"),
    ("bench/fleet_hour.py", "--no-peering",
     "--json-out", f"{FLEET_RESULTS.relative_to(ROOT)}/fleet_hour.no-peering.json"),
    ("bench/fleet_tokens_per_day.py", "--jobs", "2", "--window", "120", "--warmup", "30",
     "--out", f"{FLEET_RESULTS.relative_to(ROOT)}/fleet_tokens_per_day.json"),
    *(("bench/pd_disaggregation.py", "--workloads", w,
       "--json", f"{PD_RESULTS.relative_to(ROOT)}/{PD_DATE}-{w}.json") for w in PD_WORKLOADS),
    *(("-m", "tpuserve", "plan", *flags, "--verify", "--json",
       "--emit", f"{PLAN_RESULTS.relative_to(ROOT)}/plan-{name}.yaml")
      for name, _, flags in PLAN_CASES),
)  # fmt: skip
"""Each run's command; a plan's JSON goes to stdout, which ``--full`` writes beside its
emitted manifest (``plan-NAME.json``)."""


def check(names: list[str]) -> list[str]:
    problems = []
    for name in names:
        path = golden_path(name)
        if not path.exists():
            problems.append(f"{path.relative_to(ROOT)}: missing (run bench/goldens.py --write)")
            continue
        diff = differences(json.loads(path.read_text()), _normalise(FIGURES[name]()))
        problems += [f"{name}{d}" for d in diff[:20]]
    for name, table in TABLES.items():
        if block(table.page.read_text(), block_name(name)) != table.render():
            page = table.page.relative_to(ROOT)
            problems.append(f"{page}: the {name} table differs from its results file")
    return problems


def write(names: list[str]) -> None:
    GOLDENS.mkdir(parents=True, exist_ok=True)
    for name in names:
        text = json.dumps(_normalise(FIGURES[name]()), indent=1, sort_keys=True)
        golden_path(name).write_text(text + "\n")
        print(f"wrote {golden_path(name).relative_to(ROOT)}")
    for name, table in TABLES.items():
        text = table.page.read_text()
        table.page.write_text(replace_block(text, block_name(name), table.render()))
        print(f"rewrote the {name} table in {table.page.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite goldens and docs tables")
    parser.add_argument(
        "--full", action="store_true", help="first rerun the full runs into their results files"
    )
    parser.add_argument("--only", help=f"comma-separated figures: {', '.join(FIGURES)}")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(FIGURES)
    if args.full:
        for run in FULL_RUNS:
            print("running", " ".join(run), flush=True)
            if run[:3] == ("-m", "tpuserve", "plan"):  # its --json goes to stdout
                emitted = Path(run[run.index("--emit") + 1])
                with (ROOT / emitted.with_suffix(".json")).open("w") as out:
                    subprocess.run([sys.executable, *run], cwd=ROOT, check=True, stdout=out)
                continue
            subprocess.run([sys.executable, *run], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    if args.write or args.full:
        write(names)
        return 0
    problems = check(names)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
