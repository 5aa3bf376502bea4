#!/usr/bin/env python3
"""Issue 59's four setups at goodput-as-a-rate (`tpuserve bench --max-rate-at-slo`).

W4 (multi-turn chat, 641,680 distinct prompt tokens) on 4 engines, v5e 2x2, Llama-3.1-8B, with
each engine's HBM KV pool sized so the fleet holds 1/2, 1/3 and 1/4 of the distinct tokens
(working set 2x, 3x, 4x the fleet's HBM: group w4), or 1/1, 1/2, 1/3 of its *live* shared
working set (`sizing.live_shared_tokens`, 67,644 tokens on average: group w4live); W7
(Mooncake-style sessions, live shared set 158,221 tokens on average) at 1/2 and 1/3 of it
(group w7live; 1/4 leaves less than its largest request); W3 (agent chains, live shared set
48,363 tokens on average) at 1/2 of it (group w3live; 1/3, 4,016 tokens per engine, is less
than its largest request, 5,842 tokens with its output: 293 of 2,113 requests fail; W10,
live set 98,258 tokens, has no such group: its largest request is 60,080 tokens and at 1/2,
12,272 tokens per engine, 363 of its 2,400 requests exceed an engine's pool);
262,144 host tokens per engine; the bundled
150-request Mooncake conversation sample; and the other workloads (HBM only against host
tier + tier-aware `precise`). Each setup's search starts at the same rate, same seed.

``mooncake-full`` (only with ``--trace PATH``, the public Mooncake conversation trace, which
is not in the repository: `MOONCAKE_TRACE`): its first 5 minutes (918 of its 12,031
requests), each engine's HBM KV pool 1/2 of that window's live shared working set over 4
engines, host tier 4x that (the ``others`` group's rule, chosen for a 10-minute window whose
live set the fleet's 262,144-token tiers would not hold), first rate 1.0 req/s (the
``mooncake`` group's). No rate meets the SLO for 90 % of its requests (its arrivals come in
bursts that rescaling keeps; docs/host-kv-tier.md), so its searches shrink the rate without
end in useful time: HBM-only's was stopped after 33 rates.

  bench/host_tier_goodput.py [--only w4|w4live|w7live|w3live|mooncake|others|fleet] [--out DIR]
                             [--groups W1,w4-live-2x,...] [--setups hbm-only,tier-aware,...]
  bench/host_tier_goodput.py --only mooncake-full --trace conversation_trace.jsonl [--out DIR]
  bench/host_tier_goodput.py --table   # the results as Markdown

``fleet``: the fleet model (`tpuserve.fleet`, what `tpuserve plan` runs) on Mooncake sessions,
four v6e 1x1 replicas, 2 sessions/s for 600 s: HBM only, a 2,000,000-token host tier with
tier-blind routing, and with tier-aware `precise` (fleet-model-tiers.json).

Writes one JSON per run (the `tpuserve bench --json` summary with its ``slo_search``) and
prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

W4_DISTINCT = 641_680
WORKERS = 4
PAGE = 16
HOST = 262_144
W4_START_RATE = 8.0

SETUPS = (  # name, policy, host tier, tier-blind
    ("hbm-only", "precise", False, False),
    ("tier-blind", "precise", True, True),
    ("tier-aware", "precise", True, False),
    ("sglang-cache-aware", "sglang_cache_aware_v1", True, False),
)

# the benchmark's own HBM sizing (docs/host-kv-tier.md), host tier 4x it; first rate ~ half
# the goodput measured at 0.85 x mu_RR there
OTHERS = {  # workload: (cache tokens per engine, first rate)
    "W1": (12_288, 12.0),
    "W3": (182_272, 40.0),
    "W5": (57_344, 4.5),
    "W6": (29_696, 5.0),
    "W7": (658_432, 16.0),
    "W9": (2_226_176, 1.4),
}


def per_engine(share: int) -> int:
    """HBM tokens per engine so the fleet holds 1/share of W4's distinct tokens (whole pages)."""
    return W4_DISTINCT // (WORKERS * share) // PAGE * PAGE


MOONCAKE_TRACE = (
    "https://github.com/kvcache-ai/Mooncake (Apache-2.0), "
    "FAST25-release/traces/conversation_trace.jsonl"
)
"""Where the full public trace is (last changed in Mooncake's commit 3cca71d)."""
MOONCAKE_SHA256 = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
MOONCAKE_WINDOW_S = 300.0
"""The full trace's first 5 minutes (arrivals before 300,000 ms: 918 of its 12,031 requests,
59 minutes), chosen before any result: a goodput search of the whole trace is too slow to
repeat on the development machine, and one of its first 10 minutes (1,750 requests) was
stopped after 25 minutes unfinished, its process at 12.5 GB (docs/host-kv-tier.md)."""
MOONCAKE_SHARES = (2,)
"""1/2 of the window's live shared set (76,192 tokens per engine: 16 of its 918 requests are
larger than an engine's pool and fail in every setup); at 1/3 (50,784) 37 are, at 1/4
(38,096) 70, so there are no such groups."""
MOONCAKE_START_RATE = 1.0


def live_w4_tokens() -> float:
    return live_tokens("W4")


def live_tokens(workload: str) -> float:
    """A workload's live shared working set (`sizing.live_shared_tokens`), time-averaged."""
    from tpuserve.bench import sizing, workloads

    return sizing.live_shared_tokens(workloads.generate(workload, 0, None)).mean_tokens


def mooncake_window(path: Path) -> tuple[int, float, int, list[int]]:
    """The full trace's window (`MOONCAKE_WINDOW_S`): its requests, its live shared working
    set (time-averaged, `sizing.live_shared_tokens`), its peak, and each request's tokens
    (prompt + output)."""
    from tpuserve.bench import sizing, traces

    window = [r for r in traces.read_trace(path) if r.t < MOONCAKE_WINDOW_S]
    live = sizing.live_shared_tokens(window)
    sizes = [len(r.token_ids or ()) + r.max_tokens for r in window]
    return len(window), live.mean_tokens, live.peak_tokens, sizes


def full_trace(parser: argparse.ArgumentParser, only: str | None, trace: str | None) -> Path | None:
    """``--trace``'s path for group mooncake-full (None: not run); an argparse error naming the
    flag and where the trace is when it is needed and missing, or given for another group."""
    where = f"the full Mooncake conversation trace is at {MOONCAKE_TRACE}"
    if trace is None:
        if only == "mooncake-full":
            parser.error(f"--trace: --only mooncake-full needs PATH; {where}")
        return None
    if only not in (None, "mooncake-full"):
        parser.error(f"--trace: only with --only mooncake-full, not --only {only}")
    path = Path(trace)
    if not path.is_file():
        parser.error(f"--trace: {trace} is not a file; {where}")
    return path


def write_window(path: Path) -> Path:
    """The trace's lines that arrive before `MOONCAKE_WINDOW_S`, in a file of their own in the
    temporary directory (a fixed name: a Mooncake prompt's private tail is seeded by its path
    and line, so every setup replays the same words)."""
    import tempfile

    limit = MOONCAKE_WINDOW_S * 1000
    lines = [raw for raw in path.read_bytes().splitlines(keepends=True) if raw.strip()]
    kept = [raw for raw in lines if json.loads(raw)["timestamp"] < limit]
    if kept != lines[: len(kept)]:
        raise ValueError(f"--trace: {path}'s lines are not in timestamp order")
    window = Path(tempfile.gettempdir()) / f"mooncake-conversation-first-{limit:.0f}ms.jsonl"
    window.write_bytes(b"".join(kept))
    return window


def bench_in_processes(args: list[str], start: float) -> dict[str, object]:
    """`tpuserve bench --max-rate-at-slo` (the same `slo_search.search_max_rate` from `start`)
    with each rate replayed by its own `tpuserve bench --rate R --json` process, so that no
    run's memory outlives it: in one process a search of the 5-minute window grew past 9 GB
    (of the 10-minute one to 12.5 GB) where one run at 1-4 req/s peaks at 0.65 GB. On that
    window no rate meets the SLO (docs/host-kv-tier.md) and the search keeps dividing the
    rate by 1.25; each run's load samples (every 0.1 s of virtual time) then grow with the
    trace's virtual span, likely the growth (not measured)."""
    from tpuserve.bench.report import SLO_FACTOR
    from tpuserve.bench.slo_search import search_max_rate

    def run_at(rate: float) -> dict[str, object]:
        cmd = [sys.executable, "-m", "tpuserve", "bench", "--json", *args, "--rate", str(rate)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        result: dict[str, object] = json.loads(out)
        return result

    found = search_max_rate(run_at, start)
    result = dict(found.best) if found.best is not None else {}
    result["slo_search"] = found.record(SLO_FACTOR, start)
    result["command"] = (
        f"search_max_rate from {start} over: tpuserve bench --json {' '.join(args)} --rate R"
    )
    return result


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bench(args: list[str]) -> dict[str, object]:
    cmd = [sys.executable, "-m", "tpuserve", "bench", "--max-rate-at-slo", "--json", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, object] = json.loads(out)
    result["command"] = "tpuserve bench --max-rate-at-slo --json " + " ".join(args)
    return result


def setup_args(policy: str, host: int, tier: bool, blind: bool) -> list[str]:
    out = ["--policy", policy]
    if tier:
        out += ["--host-cache-tokens", str(host)]
    if blind:
        out.append("--tier-blind")
    return out


def row(name: str, label: str, r: dict[str, object]) -> str:
    s = r["slo_search"]
    assert isinstance(s, dict)
    return (
        f"{name:<14} {label:<20} max_rate {s['max_rate']:7.3f}  goodput {s['goodput_rps']:7.3f}"
        f"  ttft p50 {r.get('ttft_p50') or 0:.3f} p99 {r.get('ttft_p99') or 0:.3f}"
        f"  hit {r.get('hit_rate', 0):.3f} (host {r.get('host_hit_rate', 0):.3f})"
    )


def fleet_model(out: Path) -> int:
    from dataclasses import replace

    from tpuserve.fleet import FleetConfig, run_fleet

    base = FleetConfig(generation="v6e", topology="1x1", replicas=4, peak_rate=2.0,
                       trough=1.0, bursts_per_hour=0.0, duration_seconds=600.0,
                       warmup_seconds=60.0)  # fmt: skip
    tier = replace(base, host_cache_tokens=2_000_000)
    keys = ("requests", "completed", "goodput_share", "goodput_tokens_per_second",
            "cache_hit_rate", "host_cache_hit_rate", "ttft_p50", "ttft_p99")  # fmt: skip
    result = {}
    for name, config in (("hbm-only", base),
                         ("tier-blind", replace(tier, tier_blind_routing=True)),
                         ("tier-aware", tier)):  # fmt: skip
        summary = run_fleet(config).summary()
        result[name] = {k: summary[k] for k in keys}
        print(name, result[name], flush=True)
    (out / "fleet-model-tiers.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


def table(out: Path) -> int:
    """Markdown rows from the results files: group, setup, HBM tokens per engine, max rate at
    the SLO, goodput there, its ratios to HBM only and to tier-blind, TTFT p50/p99, hit rates."""
    names = [s[0] for s in SETUPS]
    groups: dict[str, dict[str, dict[str, object]]] = {}
    for f in sorted(out.glob("*.json")):
        group, _, name = f.stem.partition(".")
        if name in names:
            groups.setdefault(group, {})[name] = json.loads(f.read_text())
    print(
        "| run | setup | HBM KV / engine | max rate at SLO | goodput req/s | / HBM only "
        "| / tier-blind | TTFT p50 s | TTFT p99 s | hit rate (host part) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for group, rows in groups.items():
        base = rows.get("hbm-only")
        blind = rows.get("tier-blind")
        for name in names:
            r = rows.get(name)
            if r is None:
                continue
            s = r["slo_search"]
            assert isinstance(s, dict)
            rate = s["max_rate"]

            def ratio(other: dict[str, object] | None, rate: float = rate) -> str:
                if other is None:
                    return "-"
                o = other["slo_search"]
                assert isinstance(o, dict)
                return f"{rate / o['max_rate']:.2f}x" if o["max_rate"] else "-"

            print(f"| {group} | {name} | {r['cache_tokens']:,} | {rate:.2f} | "
                  f"{s['goodput_rps']:.2f} | {ratio(base)} | {ratio(blind)} | "
                  f"{r.get('ttft_p50') or 0:.3f} | {r.get('ttft_p99') or 0:.3f} | "
                  f"{r.get('hit_rate', 0):.3f} ({r.get('host_hit_rate', 0):.3f}) |")  # fmt: skip
    return 0


LIVE_GROUPS = {"w7live": ("W7", (2, 3)), "w3live": ("W3", (2,))}
"""`--only` groups at 1/share of a workload's live shared working set, 4.0 req/s first."""


def _selection(
    parser: argparse.ArgumentParser, flag: str, value: str | None, known: set[str]
) -> set[str] | None:
    """``value``'s comma-separated names (None: all); an argparse error naming the flag, the
    unknown names and the allowed ones (those of the runs ``--only`` selects)."""
    if not value:
        return None
    names = set(value.split(","))
    unknown = sorted(names - known)
    if unknown:
        parser.error(
            f"{flag}: {', '.join(unknown)} not allowed; allowed: {', '.join(sorted(known))}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    only = ("w4", "w4live", *LIVE_GROUPS, "mooncake", "mooncake-full", "others", "fleet")
    parser.add_argument("--only", choices=only)
    parser.add_argument("--out", default="bench/host_tier_results/2026-12-07")
    parser.add_argument("--table", action="store_true", help="Print the results as Markdown.")
    parser.add_argument("--groups", help="Only these runs (comma-separated: W1,w4-live-2x,...).")
    parser.add_argument("--setups", help="Only these setups (comma-separated: tier-aware,...).")
    parser.add_argument(
        "--trace", help="The full Mooncake conversation trace (group mooncake-full only)."
    )
    a = parser.parse_args()
    full = full_trace(parser, a.only, a.trace)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, str, list[str]]] = []
    fleet = ["--tpu", "v5e", "--topology", "2x2"]
    if a.only in (None, "w4"):
        for share in (2, 3, 4):
            cache = per_engine(share)
            base = ["--workload", "W4", *fleet, "--cache-tokens", str(cache)]
            base += ["--rate", str(W4_START_RATE)]
            for name, policy, tier, blind in SETUPS:
                runs.append((f"w4-{share}x", name, base + setup_args(policy, HOST, tier, blind)))
    if a.only in (None, "w4live"):
        live = live_w4_tokens()
        for share in (1, 2, 3):
            cache = int(live) // (WORKERS * share) // PAGE * PAGE
            base = ["--workload", "W4", *fleet, "--cache-tokens", str(cache)]
            base += ["--rate", str(W4_START_RATE)]
            for name, policy, tier, blind in SETUPS:
                runs.append(
                    (f"w4-live-{share}x", name, base + setup_args(policy, HOST, tier, blind))
                )
    for key, (workload, shares) in LIVE_GROUPS.items():
        if a.only not in (None, key):
            continue
        live = live_tokens(workload)
        for share in shares:
            cache = int(live) // (WORKERS * share) // PAGE * PAGE
            base = ["--workload", workload, *fleet, "--cache-tokens", str(cache), "--rate", "4.0"]
            group = f"{workload.lower()}-live-{share}x"
            for name, policy, tier, blind in SETUPS:
                runs.append((group, name, base + setup_args(policy, HOST, tier, blind)))
    if a.only in (None, "mooncake"):
        trace = "bench/traces/mooncake-conversation-small.jsonl"
        base = ["--trace", trace, *fleet, "--rate", "1.0"]
        for name, policy, tier, blind in SETUPS:
            runs.append(("mooncake-150", name, base + setup_args(policy, HOST, tier, blind)))
    if a.only in (None, "others"):
        for workload, (cache, start) in OTHERS.items():
            base = ["--workload", workload, *fleet, "--cache-tokens", str(cache)]
            base += ["--rate", str(start)]
            for name, policy, tier, blind in SETUPS[:3]:
                runs.append((workload, name, base + setup_args(policy, 4 * cache, tier, blind)))
    if a.table:
        return table(out)
    digest = sha256(full) if full is not None else None
    if full is not None:
        if digest != MOONCAKE_SHA256:
            print(f"note: {full} has sha256 {digest}, not the public trace's", file=sys.stderr)
        window = write_window(full)
        requests, live, peak, sizes = mooncake_window(window)
        for share in MOONCAKE_SHARES:
            cache = int(live) // (WORKERS * share) // PAGE * PAGE
            over = sum(1 for n in sizes if n > cache)
            print(
                f"mooncake-full: first {MOONCAKE_WINDOW_S:.0f} s, {requests} requests, live "
                f"shared tokens {live:,.0f} (peak {peak:,}), largest request {max(sizes):,}; "
                f"1/{share}: {cache:,} per engine, {over} requests larger",
                flush=True,
            )
            base = ["--trace", str(window), *fleet, "--cache-tokens", str(cache)]
            for name, policy, tier, blind in SETUPS:
                runs.append((f"mooncake-5min-live-{share}x", name,
                             base + setup_args(policy, 4 * cache, tier, blind)))  # fmt: skip
    if a.only == "fleet":
        return fleet_model(out)
    groups = _selection(parser, "--groups", a.groups, {group for group, _, _ in runs})
    setups = _selection(parser, "--setups", a.setups, {name for _, name, _ in runs})
    for group, name, args in runs:
        if (groups and group not in groups) or (setups and name not in setups):
            continue
        if digest is not None and group.startswith("mooncake-5min"):
            result = bench_in_processes(args, MOONCAKE_START_RATE)
            result["trace_sha256"] = digest
        else:
            result = bench(args)
        (out / f"{group}.{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(row(group, name, result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
