"""One model's flood against another's p99 through a gateway's router, the clients apart
(issue 70: "a flood on one model leaves the others' p99 within 10 % of an unloaded run").

    .venv/bin/python bench/gateway_flood.py [--rounds 8] [--samples 50] [--flood-clients 12]
        [--share 4] [--refusals 3000] [--json bench/gateway_results/flood.json]
        [--profile OUT.pstats]

A gateway's router (`tpuserve router` with the flags a TPUGateway renders that matter here:
``--max-in-flight-per-model``, ``--hold-models-only``, ``--hold-max-requests 3``,
``--hold-model-share 0.25``) in front of two engine twins, `model-a` and `model-b` (simulated
Qwen3-8B on v6e `2x4`). On a real platform the gateway's clients and the model servers run on
other machines; here everything shares one machine of 2 cores, so the bench places them:

- **core 0** (the product's side): the router, `model-b`'s twin and B's client (this
  process: sequential chat completions of 8 tokens with the official `openai` client);
- **core 1** (what a real gateway does not share a machine with): `model-a`'s twin and A's
  clients.

Arms, in a shuffled order in every round, so a machine shared with other jobs weighs on each
alike (the load average is recorded per arm):

- ``unloaded``: B alone;
- ``share``: A's ``--share`` closed-loop clients on core 1 (A at its share: all 200);
- ``flood``: A's ``--flood-clients`` closed-loop clients on core 1, each 429 retried at once
  (as the e2e test's flood): the router answers A's share and refuses the rest;
- ``burn``: the flood replaced by a process on core 1 that burns the CPU the flood's process
  used (its measured share of a core) and sends nothing: the clients' own CPU, as an arm;
- ``flood-shared``: the same flood on core 0, beside the router and B (the e2e test's
  placement, where the clients share the router's cores);
- ``burn-shared``: its CPU burnt on core 0, sending nothing.

B's p99 of an arm is over its samples pooled across rounds; its ratio to ``unloaded``'s has a
95 % interval from resampling the rounds (bootstrap, 2,000 draws). Paired by round: the
geometric mean over rounds of the arm's p99 over that round's ``unloaded`` p99, with its own
bootstrap interval (a round's load weighs on both sides of its ratio). ``--summarize FILE``
prints the table of a written run again. Before the arms, the
router's CPU per refused request is measured apart: A's share held full by ``--share`` long
requests, ``--refusals`` requests for `model-a` from a lean client (raw HTTP/1.1 keep-alive,
`bench/router_loadgen.py`) on core 1; the router's CPU over them (schedstat) per request.
``--profile`` runs the router under cProfile (then its CPU figures are the profiler's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.router_loadgen import build_request, closed_loop
from bench.router_overhead import ENTRY, Proc, cpu_seconds, start, wait_http, wait_idle
from tpuserve.cluster.ports import free_port

PRODUCT_CORE = "0"
APART_CORE = "1"
MODELS = ("model-a", "model-b")
ARMS = ("unloaded", "share", "flood", "burn", "flood-shared", "burn-shared")
SETTLE_SECONDS = 1.0
"""A flood or burner runs this long before B is measured (its process started, the router's
share full)."""
B_MAX_TOKENS = 8
LONG_MAX_TOKENS = 4000
"""The streams that hold A's share full while refusals are counted (tens of seconds each on
the twin; a holder whose stream ends opens another)."""
BOOTSTRAP_DRAWS = 2000


# ------------------------------------------------------------------ processes


def niced(nice: int) -> list[str]:
    return ["nice", "-n", str(nice)] if nice else []


def twin(model: str, core: str, nice: int = 0) -> Proc:
    port = free_port()
    cmd = [
        *niced(nice), sys.executable, "-c", ENTRY, "engine", "sim", "--port", str(port),
        "--tpu", "v6e", "--topology", "2x4", "--model-profile", "qwen3-8b",
        "--model-path", "Qwen/Qwen3-8B", "--served-model-name", model, "--log-level", "warning",
    ]  # fmt: skip
    return start(model, cmd, core, port)


PROFILED_ENTRY = """import cProfile, sys, time
from tpuserve.cli import main
profiler = cProfile.Profile(time.process_time)
profiler.enable()
try:
    sys.exit(main())
finally:
    profiler.disable()
    profiler.dump_stats({out!r})
"""


def router(
    workers: list[Proc], share: int, profile: Path | None, nice: int = 0, tree: Path | None = None
) -> Proc:
    port = free_port()
    if profile is not None:  # CPU time, not wall time: the machine is shared
        script = Path(tempfile.mkdtemp()) / "router_entry.py"
        script.write_text(PROFILED_ENTRY.format(out=str(profile)))
        head = [*niced(nice), sys.executable, str(script)]
    else:
        head = [*niced(nice), sys.executable, "-c", ENTRY]
    cmd = [
        *head, "router", "--port", str(port), "--log-level", "warning",
        "--max-in-flight-per-model", str(share), "--hold-models-only",
        "--hold-models", ",".join(MODELS), "--hold-max-requests", "3",
        "--hold-model-share", "0.25",
    ]  # fmt: skip
    for worker in workers:
        cmd += ["--worker", worker.url]
    return start("router", cmd, PRODUCT_CORE, port, tree)


def pin(core: str) -> None:
    os.sched_setaffinity(0, {int(core)})


def apart(core: str) -> None:
    """A child process of A's side: on ``core``, at the default nice (not B's)."""
    pin(core)
    if os.getpriority(os.PRIO_PROCESS, 0) != 0:
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def _flood(url: str, core: str, clients: int, max_tokens: int, stop: Any, counts: Any) -> None:
    """A's clients: ``clients`` closed-loop threads of the official client, each answer
    counted (200, 429, other) and each 429 retried at once."""
    apart(core)
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def loop(index: int) -> None:
        sent = 0
        while not stop.is_set():
            sent += 1
            slot = 2
            try:
                client.chat.completions.create(
                    model="model-a",
                    messages=[{"role": "user", "content": f"model-a {index} {sent}: a TPU?"}],
                    max_tokens=max_tokens,
                    timeout=120,
                )
                slot = 0
            except openai.APIStatusError as err:
                slot = 1 if err.status_code == 429 else 2
            except Exception:  # a failure is an outcome
                slot = 2
            with counts.get_lock():
                counts[slot] += 1

    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _burn(core: str, share: float, stop: Any) -> None:
    """Burn ``share`` of a core (process CPU time against wall time), sending nothing."""
    apart(core)
    started_wall, started_cpu = time.monotonic(), time.process_time()
    while not stop.is_set():
        due = share * (time.monotonic() - started_wall)
        if time.process_time() - started_cpu < due:
            for _ in range(2000):  # a few hundred µs of work
                pass
        else:
            time.sleep(0.002)


class Load:
    """A's side of an arm, started and stopped around it: a flood's process, or burners (as
    many processes as the flood has clients, so the scheduler weighs them as it weighs the
    flood's threads, together burning the CPU share the flood used)."""

    def __init__(self, flood: tuple[Any, ...] | None = None,
                 burn: tuple[str, float, int] | None = None) -> None:  # fmt: skip
        spawn = multiprocessing.get_context("spawn")
        self.stop = spawn.Event()
        self.counts = spawn.Array("l", 3)
        if flood is not None:
            self.processes: list[Any] = [
                spawn.Process(target=_flood, args=(*flood, self.stop, self.counts), daemon=True)
            ]
        else:
            assert burn is not None
            core, share, count = burn
            fork = multiprocessing.get_context("fork")  # a spin loop: nothing to re-import
            self.stop = fork.Event()
            self.processes = [
                fork.Process(target=_burn, args=(core, share / count, self.stop), daemon=True)
                for _ in range(count)
            ]
        for process in self.processes:
            process.start()

    def counted(self) -> list[int]:
        with self.counts.get_lock():
            return [int(self.counts[i]) for i in range(3)]

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes if p.pid is not None)

    def halt(self) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(180)
            if process.is_alive():
                process.kill()
                process.join()


# ------------------------------------------------------------------ B's client


class BClient:
    """B's sequential chat completions (the official client, this process, core 0)."""

    def __init__(self, url: str) -> None:
        import openai

        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self.sent = 0

    def one(self) -> float:
        self.sent += 1
        started = time.perf_counter()
        answer = self.client.chat.completions.create(
            model="model-b",
            messages=[{"role": "user", "content": f"model-b {self.sent}: what is a TPU?"}],
            max_tokens=B_MAX_TOKENS,
            timeout=120,
        )
        took = time.perf_counter() - started
        if not (answer.choices and answer.choices[0].message.content):
            raise RuntimeError(f"model-b request {self.sent}: an empty answer")
        return took

    def samples(self, count: int) -> list[float]:
        return [self.one() for _ in range(count)]


# ------------------------------------------------------------------ the arms


def wait_for(what: str, check: Any, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {seconds:g} s")
        time.sleep(0.05)


def run_arm(
    arm: str,
    url: str,
    b: BClient,
    pids: dict[str, int],
    args: argparse.Namespace,
    flood_cpu: dict[str, list[float]],
) -> dict[str, Any]:
    """One arm of one round: its load started, B's samples, the processes' CPU over them."""
    placement = PRODUCT_CORE if arm.endswith("-shared") else APART_CORE
    load: Load | None = None
    burn_share = None
    if arm in ("share", "flood", "flood-shared"):
        clients = args.share if arm == "share" else args.flood_clients
        load = Load(flood=(url, placement, clients, B_MAX_TOKENS))
        wanted = 0 if arm == "share" else 1
        wait_for(f"{arm} running", lambda: load is not None and load.counted()[wanted] > 0)
    elif arm in ("burn", "burn-shared"):
        measured = flood_cpu["flood" if arm == "burn" else "flood-shared"]
        burn_share = statistics.mean(measured)
        load = Load(burn=(placement, burn_share, args.flood_clients))
    if load is not None:
        time.sleep(SETTLE_SECONDS)
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    load_before = load.cpu() if load is not None else 0.0
    counts_before = load.counted() if load is not None else [0, 0, 0]
    load_avg_before = os.getloadavg()[0]
    started = time.monotonic()
    seconds = b.samples(args.samples)
    wall = time.monotonic() - started
    cpu = {name: (cpu_seconds(pid) - before[name]) / wall for name, pid in pids.items()}
    row: dict[str, Any] = {
        "arm": arm,
        "b_seconds": seconds,
        "wall_seconds": wall,
        "cpu_share": cpu,  # each process's CPU seconds per wall second over B's samples
        "load_average": (load_avg_before + os.getloadavg()[0]) / 2,
    }
    if load is not None:
        load_cpu = (load.cpu() - load_before) / wall
        row["cpu_share"]["a_clients" if burn_share is None else "burner"] = load_cpu
        if burn_share is None:
            counts = [n - m for n, m in zip(load.counted(), counts_before, strict=True)]
            row["a_per_second"] = {
                "200": counts[0] / wall, "429": counts[1] / wall, "other": counts[2] / wall,
            }  # fmt: skip
            if arm != "share":
                flood_cpu[arm].append(load_cpu)
        else:
            row["burn_target"] = burn_share
        load.halt()
    return row


# ------------------------------------------------------------------ refusal cost


def _refusals(url: str, core: str, count: int, out: Any) -> None:
    apart(core)
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps(
        {
            "model": "model-a",
            "messages": [{"role": "user", "content": "model-a: what is a TPU? " * 4}],
            "max_tokens": B_MAX_TOKENS,
        }
    )
    request = build_request("/v1/chat/completions", body)
    run = asyncio.run(closed_loop([(host, int(port))], lambda _i: request, count, 4))
    statuses = [r.status for r in run.results]
    out.put({"429": statuses.count(429), "other": len(statuses) - statuses.count(429),
             "errors": run.errors, "wall_seconds": run.wall_seconds})  # fmt: skip


TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def user_system(pid: int) -> tuple[float, float]:
    """Seconds ``pid`` has run in user and in system mode (/proc/PID/stat, in ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS_PER_SECOND, int(fields[12]) / TICKS_PER_SECOND


def hold_share(url: str, share: int, stop: threading.Event) -> list[threading.Thread]:
    """``share`` long streams of model-a through the router at ``url``, open until ``stop``
    (its share full: every other model-a request is refused)."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    holding = threading.Semaphore(0)

    def hold() -> None:
        while not stop.is_set():
            stream = client.chat.completions.create(
                model="model-a",
                messages=[{"role": "user", "content": "hold the share"}],
                max_tokens=LONG_MAX_TOKENS,
                stream=True,
                timeout=300,
            )
            with stream:
                first = True
                for _chunk in stream:
                    if first:
                        holding.release()
                        first = False
                    if stop.is_set():
                        break

    holders = [threading.Thread(target=hold, daemon=True) for _ in range(share)]
    for thread in holders:
        thread.start()
    for _ in holders:
        if not holding.acquire(timeout=120):
            raise RuntimeError("the long requests holding model-a's share did not start")
    return holders


def refusal_cost(routers: dict[str, Proc], share: int, count: int, repeats: int) -> dict[str, Any]:
    """Each router's CPU per request refused at A's share (held full by ``share`` long
    streams), ``count`` requests from a lean client on core 1, ``repeats`` times per router
    in turn (a before/after pair compared under the same load)."""
    stop = threading.Event()
    holders = [t for proc in routers.values() for t in hold_share(proc.url, share, stop)]
    context = multiprocessing.get_context("spawn")
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in routers}
    try:
        for _ in range(repeats):
            for label, proc in routers.items():
                out = context.Queue()
                before = cpu_seconds(proc.popen.pid)
                split_before = user_system(proc.popen.pid)
                sender = context.Process(target=_refusals, args=(proc.url, APART_CORE, count, out))
                sender.start()
                result: dict[str, Any] = out.get(timeout=600)
                sender.join(60)
                used = cpu_seconds(proc.popen.pid) - before
                result["router_cpu_us_per_request"] = used / count * 1e6
                user, system = (
                    (after - was) / count * 1e6
                    for after, was in zip(user_system(proc.popen.pid), split_before, strict=True)
                )
                result["router_user_us_per_request"] = user
                result["router_system_us_per_request"] = system
                result["refused_per_second"] = result["429"] / result["wall_seconds"]
                result["load_average"] = os.getloadavg()[0]
                runs[label].append(result)
    finally:
        stop.set()
        for thread in holders:
            thread.join(300)
    summary: dict[str, Any] = {}
    for label, results in runs.items():
        costs = [r["router_cpu_us_per_request"] for r in results]
        summary[label] = {
            "router_cpu_us_per_request_median": statistics.median(costs),
            "router_user_us_per_request_median": statistics.median(
                r["router_user_us_per_request"] for r in results
            ),
            "router_system_us_per_request_median": statistics.median(
                r["router_system_us_per_request"] for r in results
            ),
            "router_cpu_us_per_request": costs,
            "refused": sum(r["429"] for r in results),
            "sent": count * len(results),
            "refused_per_second_median": statistics.median(
                r["refused_per_second"] for r in results
            ),
            "load_average": [round(r["load_average"], 1) for r in results],
        }
    return summary


# ------------------------------------------------------------------ summary


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def summarize(rows: list[dict[str, Any]], arms: list[str], rounds: int) -> dict[str, Any]:
    by_round: dict[str, list[list[float]]] = {arm: [] for arm in arms}
    for row in rows:
        by_round[row["arm"]].append(row["b_seconds"])
    rng = random.Random(70)
    out: dict[str, Any] = {}
    base = [s for r in by_round["unloaded"] for s in r]
    for arm in arms:
        pooled = [s for r in by_round[arm] for s in r]
        of_arm = [row for row in rows if row["arm"] == arm]
        entry: dict[str, Any] = {
            "samples": len(pooled),
            "b_p50": statistics.median(pooled),
            "b_p99": p99(pooled),
            "b_p99_ratio": p99(pooled) / p99(base),
            "b_p99_ratio_by_round": [
                p99(own) / p99(unloaded)
                for own, unloaded in zip(by_round[arm], by_round["unloaded"], strict=False)
            ],
            "load_average": [round(row["load_average"], 2) for row in of_arm],
            "cpu_share": {
                name: statistics.mean(row["cpu_share"][name] for row in of_arm)
                for name in of_arm[0]["cpu_share"]
            },
        }
        if "a_per_second" in of_arm[0]:
            entry["a_per_second"] = {
                status: statistics.mean(row["a_per_second"][status] for row in of_arm)
                for status in ("200", "429", "other")
            }
        draws = []
        for _ in range(BOOTSTRAP_DRAWS):
            picked = [rng.randrange(rounds) for _ in range(rounds)]
            own = [s for i in picked for s in by_round[arm][i]]
            unloaded = [s for i in picked for s in by_round["unloaded"][i]]
            draws.append(p99(own) / p99(unloaded))
        draws.sort()
        paired = entry["b_p99_ratio_by_round"]
        entry["b_p99_ratio_round_geomean"] = statistics.geometric_mean(paired)
        means = sorted(
            statistics.geometric_mean([paired[rng.randrange(len(paired))] for _ in paired])
            for _ in range(BOOTSTRAP_DRAWS)
        )
        entry["b_p99_ratio_round_geomean_95"] = [
            means[int(0.025 * BOOTSTRAP_DRAWS)], means[int(0.975 * BOOTSTRAP_DRAWS) - 1]
        ]  # fmt: skip
        entry["b_p99_ratio_95"] = [
            draws[int(0.025 * BOOTSTRAP_DRAWS)], draws[int(0.975 * BOOTSTRAP_DRAWS) - 1]
        ]  # fmt: skip
        out[arm] = entry
    return out


def print_table(summary: dict[str, Any]) -> None:
    print(
        f"{'arm':<14}{'B p50':>8}{'B p99':>8}{'p99/unl':>9}{'95 % interval':>16}"
        f"{'per round':>10}{'95 % interval':>16}"
        f"{'A 200/s':>9}{'A 429/s':>9}{'router':>8}{'A side':>8}{'load':>12}"
    )
    for arm, e in summary.items():
        rates = e.get("a_per_second", {})
        cpu = e["cpu_share"]
        side = cpu.get("a_clients", cpu.get("burner"))
        low, high = e["b_p99_ratio_95"]
        loads = e["load_average"]
        print(
            f"{arm:<14}{e['b_p50']:>8.3f}{e['b_p99']:>8.3f}{e['b_p99_ratio']:>9.2f}"
            f"{f'{low:.2f}-{high:.2f}':>16}{e['b_p99_ratio_round_geomean']:>10.2f}"
            f"{'{:.2f}-{:.2f}'.format(*e['b_p99_ratio_round_geomean_95']):>16}"
            f"{rates.get('200', 0):>9.0f}{rates.get('429', 0):>9.0f}"
            f"{cpu['router']:>8.2f}{'' if side is None else f'{side:.2f}':>8}"
            f"{f'{min(loads):.1f}-{max(loads):.1f}':>12}"
        )


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--samples", type=int, default=50, help="B's requests per arm")
    parser.add_argument("--flood-clients", type=int, default=12)
    parser.add_argument("--share", type=int, default=4, help="--max-in-flight-per-model")
    parser.add_argument("--refusals", type=int, default=2000, help="refused requests per run")
    parser.add_argument("--refusal-repeats", type=int, default=3, help="runs per router")
    parser.add_argument(
        "--baseline-tree", type=Path,
        help="another checkout (git archive, with this one's _native copied in) whose router's "
        "refusal cost is measured in turn with this tree's",
    )  # fmt: skip
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="the router under cProfile, its stats here")
    parser.add_argument(
        "--product-nice", type=int, default=0,
        help="nice of the router, B's twin and B's client (negative: as root; a CPU request's "
        "weight, so the machine's other jobs take less of core 0)",
    )  # fmt: skip
    parser.add_argument("--summarize", type=Path, help="print a written run's table, and exit")
    args = parser.parse_args()
    if args.summarize is not None:
        written = json.loads(args.summarize.read_text())
        rounds = 1 + max(row["round"] for row in written["rows"])
        arms_run = [arm for arm in ARMS if any(row["arm"] == arm for row in written["rows"])]
        print_table(summarize(written["rows"], arms_run, rounds))
        return
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown or "unloaded" not in arms:
        parser.error(f"--arms: allowed {', '.join(ARMS)}, unloaded among them; got {args.arms}")
    pin(PRODUCT_CORE)  # B's client
    if args.product_nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.product_nice)
    twin_a = twin("model-a", APART_CORE)
    twin_b = twin("model-b", PRODUCT_CORE, args.product_nice)
    procs = [twin_a, twin_b]
    try:
        for proc in procs:
            wait_http(proc.url, "/health", 180)
        gateway = router(procs, args.share, args.profile, args.product_nice)
        procs.append(gateway)
        wait_http(gateway.url, "/readiness", 180)
        for model in MODELS:
            wait_for(f"{model} served", lambda m=model: m in models(gateway.url))
        b = BClient(gateway.url)
        b.samples(20)  # warm: connections, the tokenizer, the twins
        wait_idle(gateway.popen.pid)
        pids = {"router": gateway.popen.pid, "twin_a": twin_a.popen.pid,
                "twin_b": twin_b.popen.pid}  # fmt: skip
        routers = {"this tree": gateway}
        if args.baseline_tree is not None:
            base = router(procs[:2], args.share, None, args.product_nice, args.baseline_tree)
            procs.append(base)
            wait_http(base.url, "/readiness", 180)
            for model in MODELS:
                wait_for(f"{model} served (baseline)", lambda m=model: m in models(base.url))
            BClient(base.url).samples(20)
            routers["baseline"] = base
        cost = refusal_cost(routers, args.share, args.refusals, args.refusal_repeats)
        for label, entry in cost.items():
            print(
                f"refusals through {label}: {entry['refused']} of {entry['sent']} refused "
                f"({entry['refused_per_second_median']:.0f}/s), router CPU per request "
                + ", ".join(f"{c:.0f}" for c in entry["router_cpu_us_per_request"])
                + f" µs (median {entry['router_cpu_us_per_request_median']:.0f}: user "
                f"{entry['router_user_us_per_request_median']:.0f}, system "
                f"{entry['router_system_us_per_request_median']:.0f})"
            )
        if args.rounds == 0:
            if args.json is not None:
                args.json.write_text(
                    json.dumps({"command": " ".join(sys.argv), "refusal_cost": cost}, indent=1)
                    + "\n"
                )
            return
        flood_cpu: dict[str, list[float]] = {"flood": [], "flood-shared": []}
        for placement in ("flood", "flood-shared"):  # the burners' first target
            if placement in arms:
                run_arm(placement, gateway.url, b, pids, argparse.Namespace(
                    **{**vars(args), "samples": 10}), flood_cpu)  # fmt: skip
        rows = []
        order = random.Random(7)
        for index in range(args.rounds):
            shuffled = order.sample(arms, len(arms))
            for arm in shuffled:
                row = run_arm(arm, gateway.url, b, pids, args, flood_cpu)
                row["round"] = index
                rows.append(row)
                print(
                    f"round {index} {arm:<13} B p99 {p99(row['b_seconds']):.3f} s "
                    f"load {row['load_average']:.1f} router {row['cpu_share']['router']:.2f}",
                    flush=True,
                )
        summary = summarize(rows, arms, args.rounds)
        print_table(summary)
        if args.json is not None:
            args.json.write_text(
                json.dumps(
                    {
                        "command": " ".join(sys.argv),
                        "date": time.strftime("%Y-%m-%d", time.gmtime()),
                        "cores": os.cpu_count(),
                        "settings": {k: str(v) for k, v in vars(args).items()},
                        "refusal_cost": cost,
                        "arms": summary,
                        "rows": rows,
                    },
                    indent=1,
                )
                + "\n"
            )
    finally:
        for proc in reversed(procs):
            if proc.name == "router" and args.profile is not None:
                proc.popen.send_signal(2)  # cProfile writes its stats on an orderly exit
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(30)
            proc.stop()


def models(url: str) -> list[str]:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
            return [m["id"] for m in json.load(response)["data"]]
    except OSError:
        return []


if __name__ == "__main__":
    main()
