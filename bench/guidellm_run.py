"""GuideLLM (the vLLM project's benchmark client) against tpuserve: router policies and one engine.

Runs GuideLLM, unchanged, from its own virtual environment (``bench/guidellm_venv.sh``) against
an endpoint, and writes each run three ways: GuideLLM's own JSON, a report in llm-d's
benchmark report format (version 0.1: ``scenario`` and ``metrics``, llm-d-benchmark
``workload/report/README.md``), and one summary line the way TPU serving recipes report:
output tokens per second per chip, with the TTFT and ITL it was served at and whether the
TTFT target was met.

Setups (``--setups``, each started here on loopback and stopped after its run, or
``--target URL`` for an endpoint already running):

- ``router:POLICY``: ``tpuserve up --workers N --policy POLICY`` (engine twins + router);
- ``single``: one engine twin (``tpuserve engine sim``), the same slice.

Every engine and the router get the same tokenizer GuideLLM uses (``--tokenizer``, default the
tiny model's, ``python -m sglang_tpu.tiny_model --root ... --check``), so GuideLLM's prompt
token counts are the engines' and the precise policy's. The engine twins run on the modelled
TPU clock, so the figures are the twin's performance model, not a TPU's. ``--time-scale S``
runs that clock S real seconds per modelled second (S < 1: faster): ``--rate`` is in modelled
requests/s (GuideLLM is asked for rate / S), and the llm-d reports and summary are converted
back to modelled time (latencies / S, throughputs x S); GuideLLM's own JSON stays in real
seconds. The client's and router's own real time is scaled up with them, so keep S where their
milliseconds are small against the engines' (a TTFT of 100 ms at S = 0.25 carries 4x the
router's real overhead). ``--stream-interval N`` is the engines' (SGLang's flag): a chunk every
N tokens after the first, fewer chunks to parse for long outputs on a small machine.

Workloads (``--workload``):

- ``shared-prefix``: ``--prefixes`` shared prefixes of ``--prefix-tokens`` tokens, then
  ``--prompt-tokens`` of each request's own, ``--output-tokens`` out;
- ``1k1k``, ``1k8k``, ``8k1k``: 1,024 or 8,192 tokens in, 1,024 or 8,192 out, nothing shared
  (TPU recipes' fixed shapes; ``tpuserve bench --workload 1k1k`` etc. are the same shapes).

    bench/guidellm_venv.sh                                   # once
    .venv/bin/python bench/guidellm_run.py --workload shared-prefix --rate 20 --max-seconds 60 \\
        --setups router:precise,router:round_robin,single --out bench/guidellm_results/run1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TPUSERVE = [sys.executable, "-m", "tpuserve"]
READY_TIMEOUT_SECONDS = 60.0
LLMD_REPORT_VERSION = "0.1"
FIXED = {"1k1k": (1024, 1024), "1k8k": (1024, 8192), "8k1k": (8192, 1024)}
"""TPU recipes' fixed shapes: (prompt tokens, output tokens)."""


def guidellm_python() -> str:
    """The GuideLLM environment's python (installs it the first time)."""
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "guidellm_venv.sh")], check=True, capture_output=True,
        text=True, cwd=ROOT,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def tiny_tokenizer_dir() -> Path:
    """The tiny model's directory (its tokenizer.json and tokenizer_config.json), built
    offline by scripts/install-real-sglang.sh; raises if it is not built."""
    cache = Path(os.environ.get("TPUSERVE_CACHE", Path.home() / ".cache" / "tpuserve"))
    out = subprocess.run(
        [sys.executable, "-m", "sglang_tpu.tiny_model", "--root", str(cache / "sglang" / "models"),
         "--check"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(
            "--tokenizer: the tiny model is not built (scripts/install-real-sglang.sh builds it); "
            "give a directory with tokenizer.json"
        )
    return Path(out.stdout.strip().splitlines()[-1])


def _rates(value: str) -> list[float]:
    try:
        rates = [float(x) for x in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not RATE[,RATE...]") from None
    if any(r <= 0 for r in rates) or rates != sorted(set(rates)):
        raise argparse.ArgumentTypeError(f"{value!r}: rates must be > 0 and increasing")
    return rates


def clock(args: argparse.Namespace) -> float:
    """Real seconds per modelled second; 1 at ``--time-scale 0`` (steps back to back: no
    modelled clock to convert to, the reports stay in real seconds)."""
    scale: float = args.time_scale or 1.0
    return scale


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url}: not ready within {READY_TIMEOUT_SECONDS} s")


def engine_args(args: argparse.Namespace, tokenizer: Path) -> list[str]:
    """Every engine twin's flags but its port and time scale."""
    return [
        "--tokenizer", str(tokenizer / "tokenizer.json"), "--tpu", args.tpu,
        "--topology", args.topology, "--model-profile", args.model_profile,
        "--served-model-name", args.model, "--enable-cache-report",
        "--stream-interval", str(args.stream_interval),
    ]  # fmt: skip


def _joined(flags: list[str]) -> list[str]:
    """``--flag value`` pairs as ``--flag=value`` (one ``--engine-arg`` each)."""
    out: list[str] = []
    for item in flags:
        if out and not item.startswith("--") and "=" not in out[-1]:
            out[-1] += "=" + item
        else:
            out.append(item)
    return out


@contextlib.contextmanager
def started(setup: str, args: argparse.Namespace, tokenizer: Path) -> Iterator[tuple[str, int]]:
    """The setup running on loopback: its base URL and how many engines serve behind it."""
    port = free_port()
    if setup == "single":
        cmd = [*TPUSERVE, "engine", "sim", "--port", str(port), *engine_args(args, tokenizer),
               "--time-scale", str(args.time_scale)]  # fmt: skip
        engines = 1
    elif setup.startswith("router:"):
        cmd = [
            *TPUSERVE, "up", "--workers", str(args.workers), "--port", str(port),
            "--policy", setup.split(":", 1)[1], "--time-scale", str(args.time_scale),
            *(f"--engine-arg={a}" for a in _joined(engine_args(args, tokenizer))),
            f"--router-arg=--tokenizer={tokenizer / 'tokenizer.json'}",
        ]  # fmt: skip
        engines = args.workers
    else:
        raise SystemExit(f"--setups: {setup!r} is not allowed; allowed: router:POLICY, single")
    log = (args.out / f"{setup.replace(':', '-')}.server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, engines
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def data_spec(args: argparse.Namespace) -> dict[str, Any]:
    """GuideLLM's ``synthetic_text`` data (its 0.7+ ``prefix_buckets`` for shared prefixes)."""
    if args.workload in FIXED:
        prompt, output = FIXED[args.workload]
        return {"kind": "synthetic_text", "prompt_tokens": prompt, "output_tokens": output}
    return {
        "kind": "synthetic_text",
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "prefix_buckets": [
            {"bucket_weight": 100, "prefix_count": args.prefixes,
             "prefix_tokens": args.prefix_tokens},
        ],
    }  # fmt: skip


def scenario(url: str, args: argparse.Namespace, tokenizer: Path, out: Path) -> dict[str, Any]:
    """A GuideLLM 0.8 scenario file (``guidellm run -c FILE``): one constant-rate benchmark."""
    constraints: list[dict[str, Any]] = [{"kind": "max_duration", "seconds": args.max_seconds}]
    if args.max_requests:
        constraints.append({"kind": "max_requests", "count": args.max_requests})
    return {
        "backend": {"kind": "openai_http", "target": url, "model": args.model,
                    "request_format": "/v1/chat/completions"},
        "profile": {"kind": "constant", "rate": [r / clock(args) for r in args.rate]},
        "constraints": constraints,
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "data": [data_spec(args)],
        "seed": {"kind": "static", "value": args.seed},
        "outputs": [{"kind": "json", "path": str(out)}],
    }  # fmt: skip


def run_guidellm(
    python: str, url: str, args: argparse.Namespace, tokenizer: Path, name: str
) -> dict[str, Any]:
    out_dir = args.out / name
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "guidellm.json"
    spec = out_dir / "scenario.json"
    spec.write_text(json.dumps({"spec": scenario(url, args, tokenizer, report)}, indent=1) + "\n")
    guidellm = str(Path(python).parent / "guidellm")
    cmd = [guidellm, "run", "-c", str(spec), "--disable-console-interactive", *args.guidellm_arg]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with (out_dir / "guidellm.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    data: dict[str, Any] = json.loads(report.read_text())
    return data


def _dist(metric: dict[str, Any], units: str, scale: float = 1.0) -> dict[str, Any]:
    """A GuideLLM distribution summary in llm-d's statistics block (mean, p10/p50/p90...)."""
    pct = metric.get("percentiles", {})
    out: dict[str, Any] = {"units": units}
    for key, src in (("mean", metric.get("mean")), ("stddev", metric.get("std_dev")),
                     ("min", metric.get("min")), ("max", metric.get("max")),
                     ("p10", pct.get("p10")), ("p50", pct.get("p50") or metric.get("median")),
                     ("p90", pct.get("p90")), ("p95", pct.get("p95")),
                     ("p99", pct.get("p99"))):  # fmt: skip
        if isinstance(src, int | float):
            out[key] = src * scale
    return out


ROUTER_TOKENS = ("tpuserve_router_prompt_tokens_total", "tpuserve_router_cached_tokens_total")
"""The router's own token counters (from each response's usage), summed over workers."""


def router_token_counts(metrics_text: str) -> dict[str, float]:
    """Sum each of ``ROUTER_TOKENS`` over its label sets in a Prometheus text exposition."""
    sums = dict.fromkeys(ROUTER_TOKENS, 0.0)
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[-1])
    return sums


def router_hit_rate(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Cached / prompt tokens the router counted between two reads of its /metrics: the hit
    rate a user reads off the router, no per-request script needed."""
    prompt = after[ROUTER_TOKENS[0]] - before[ROUTER_TOKENS[0]]
    cached = after[ROUTER_TOKENS[1]] - before[ROUTER_TOKENS[1]]
    return cached / prompt if prompt > 0 else None


def router_counts(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return router_token_counts(r.read().decode())


def _scaled(value: Any, factor: float) -> Any:
    return value * factor if isinstance(value, int | float) else value


def successful(benchmark: dict[str, Any], name: str) -> dict[str, Any]:
    metric = benchmark.get("metrics", {}).get(name, {})
    value: dict[str, Any] = metric.get("successful", metric) if isinstance(metric, dict) else {}
    return value


def hit_rate(benchmark: dict[str, Any]) -> float | None:
    """Cached prompt tokens / prompt tokens over the successful requests. GuideLLM keeps each
    request's ``cached_tokens`` (from the engines' usage) but aggregates none."""
    requests = benchmark.get("requests", {})
    done = requests.get("successful", []) if isinstance(requests, dict) else []
    prompt = sum(r.get("prompt_tokens") or 0 for r in done)
    cached = sum(r.get("cached_tokens") or 0 for r in done)
    return cached / prompt if prompt else None


def llmd_report(
    benchmark: dict[str, Any],
    setup: str,
    args: argparse.Namespace,
    engines: int,
    rate: float | None = None,
) -> dict[str, Any]:
    """One GuideLLM benchmark as llm-d's benchmark report (version 0.1), in modelled time."""
    totals = benchmark.get("metrics", {}).get("request_totals", {})
    slow = 1.0 / clock(args)  # real seconds -> modelled seconds
    rate = args.rate[-1] if rate is None else rate
    return {
        "version": LLMD_REPORT_VERSION,
        "scenario": {
            "description": (
                f"tpuserve {setup}: {args.workload} at {rate:g} req/s; times and rates in "
                f"the engine twins' modelled seconds (GuideLLM's real ones / {clock(args):g})"
            ),
            "host": {
                "type": ["replica"] * engines,
                "accelerator": [
                    {
                        "model": f"TPU {args.tpu} {args.topology} (engine twin)",
                        "count": args.chips_per_engine,
                        "parallelism": {"tp": args.chips_per_engine},
                    }
                ]
                * engines,
            },
            "platform": {
                "engine": [
                    {
                        "name": "tpuserve-engine-twin",
                        "args": {
                            "--model-profile": args.model_profile,
                            "--time-scale": args.time_scale,
                            "--stream-interval": args.stream_interval,
                        },
                    }
                ]
                * engines,
            },
            "model": {"name": args.model},
            "load": {
                "name": "guidellm",
                "type": args.workload,
                "args": {
                    "data": data_spec(args),
                    "profile": "constant",
                    "rate": rate,
                    "max_seconds": args.max_seconds,
                },
            },
        },
        "metrics": {
            "time": {"duration": _scaled(benchmark.get("duration"), slow)},
            "requests": {
                "total": totals.get("total"),
                "failures": totals.get("errored"),
                "input_length": _dist(successful(benchmark, "prompt_token_count"), "count"),
                "output_length": _dist(successful(benchmark, "output_token_count"), "count"),
            },
            "latency": {
                "request_latency": _dist(successful(benchmark, "request_latency"), "s", slow),
                "time_to_first_token": _dist(
                    successful(benchmark, "time_to_first_token_ms"), "ms", slow
                ),
                "time_per_output_token": _dist(
                    successful(benchmark, "time_per_output_token_ms"), "ms/token", slow
                ),
                "inter_token_latency": _dist(
                    successful(benchmark, "inter_token_latency_ms"), "ms/token", slow
                ),
            },
            "metadata": {
                "prefix_cache_hit_rate": hit_rate(benchmark),
                "successful": totals.get("successful"),
                "incomplete": totals.get("incomplete"),
            },
            "throughput": {
                "output_tokens_per_sec": _scaled(
                    successful(benchmark, "output_tokens_per_second").get("mean"), 1 / slow
                ),
                "total_tokens_per_sec": _scaled(
                    successful(benchmark, "tokens_per_second").get("mean"), 1 / slow
                ),
                "requests_per_sec": _scaled(
                    successful(benchmark, "requests_per_second").get("mean"), 1 / slow
                ),
            },
        },
    }


def summary(
    report: dict[str, Any], setup: str, chips: int, ttft_target_ms: float, itl_target_ms: float
) -> dict[str, Any]:
    """The TPU recipes' figure: output tokens/s per chip, at the TTFT and ITL served, and
    whether p99 TTFT and p99 ITL met their targets."""
    m = report["metrics"]
    out_tps = m["throughput"]["output_tokens_per_sec"] or 0.0
    ttft = m["latency"]["time_to_first_token"]
    itl = m["latency"]["inter_token_latency"]
    return {
        "setup": setup,
        "chips": chips,
        "requests": m["requests"]["total"],
        "completed": m["metadata"]["successful"],
        "failures": m["requests"]["failures"],
        "output_tokens_per_second": out_tps,
        "output_tokens_per_second_per_chip": out_tps / chips,
        "ttft_p50_ms": ttft.get("p50"),
        "ttft_p99_ms": ttft.get("p99"),
        "itl_p50_ms": itl.get("p50"),
        "itl_p99_ms": itl.get("p99"),
        "hit_rate": m["metadata"]["prefix_cache_hit_rate"],
        "router_hit_rate": m["metadata"].get("router_prefix_cache_hit_rate"),
        "ttft_target_ms": ttft_target_ms,
        "ttft_target_met": ttft.get("p99") is not None and ttft["p99"] <= ttft_target_ms,
        "itl_target_ms": itl_target_ms,
        "itl_target_met": itl.get("p99") is not None and itl["p99"] <= itl_target_ms,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| setup | chips | requests (completed) | failed | output tok/s | per chip "
        "| TTFT p50 / p99 ms | ITL p50 / p99 ms | hit rate | targets met (TTFT, ITL) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.get('label', r['setup'])} | {r['chips']} "
            f"| {r['requests']} ({r['completed']}) | {r['failures']} "
            f"| {r['output_tokens_per_second']:.0f} | {r['output_tokens_per_second_per_chip']:.0f} "
            f"| {r['ttft_p50_ms'] or 0:.0f} / {r['ttft_p99_ms'] or 0:.0f} "
            f"| {r['itl_p50_ms'] or 0:.1f} / {r['itl_p99_ms'] or 0:.1f} "
            f"| {'–' if r['hit_rate'] is None else format(r['hit_rate'], '.3f')} "
            f"| {'yes' if r['ttft_target_met'] else 'no'}, "
            f"{'yes' if r['itl_target_met'] else 'no'} |"
        )
    return "\n".join(lines)


def at_target(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setup, the TPU recipes' figure: the rate with the most output tokens/s per chip
    whose p99 TTFT and p99 ITL met their targets (none if no rate did)."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = r["setup"]
        met = r["ttft_target_met"] and r["itl_target_met"]
        top = best.get(key)
        if met and (top is None or r["output_tokens_per_second_per_chip"]
                    > top["output_tokens_per_second_per_chip"]):  # fmt: skip
            best[key] = r
        best.setdefault(key, {})
    return [{"setup": k, **({"rate": v["rate"],
             "output_tokens_per_second_per_chip": v["output_tokens_per_second_per_chip"],
             "ttft_p99_ms": v["ttft_p99_ms"], "itl_p99_ms": v["itl_p99_ms"]} if v else {})}
            for k, v in best.items()]  # fmt: skip


def markdown_at_target(best: list[dict[str, Any]], ttft_ms: float, itl_ms: float) -> str:
    lines = [
        f"| setup | rate met at most tok/s per chip (p99 TTFT <= {ttft_ms:g} ms, "
        f"p99 ITL <= {itl_ms:g} ms) | output tok/s per chip | p99 TTFT / ITL ms |",
        "|---|---|---|---|",
    ]
    for b in best:
        if "rate" not in b:
            lines.append(f"| {b['setup']} | none met both | – | – |")
            continue
        lines.append(
            f"| {b['setup']} | {b['rate']:g} req/s | {b['output_tokens_per_second_per_chip']:.0f} "
            f"| {b['ttft_p99_ms']:.0f} / {b['itl_p99_ms']:.1f} |"
        )
    return "\n".join(lines)


def write_reports(args: argparse.Namespace, runs: list[tuple[str, dict[str, Any], int]]) -> None:
    rows = []
    for setup, data, engines in runs:
        name = setup.replace(":", "-")
        router = args.out / name / "router.json"
        benchmarks = data["benchmarks"][-len(args.rate) :]
        for rate, benchmark in zip(args.rate, benchmarks, strict=True):
            report = llmd_report(benchmark, setup, args, engines, rate)
            if router.exists() and len(args.rate) == 1:  # the router's own count
                report["metrics"]["metadata"].update(json.loads(router.read_text()))
            suffix = "" if len(args.rate) == 1 else f"-{rate:g}"
            path = args.out / f"{name}{suffix}.llmd-report.json"
            path.write_text(json.dumps(report, indent=1) + "\n")
            row = summary(report, setup, engines * args.chips_per_engine, args.ttft_target_ms,
                          args.itl_target_ms)  # fmt: skip
            label = {"label": f"{setup} @ {rate:g}"} if len(args.rate) > 1 else {}
            rows.append({**row, "rate": rate, **label})
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows))
    if len(args.rate) > 1:
        best = at_target(rows)
        (args.out / "at_target.json").write_text(json.dumps(best, indent=1) + "\n")
        print()
        print(markdown_at_target(best, args.ttft_target_ms, args.itl_target_ms))


def report_only(args: argparse.Namespace) -> int:
    runs = []
    for setup in ["target"] if args.target else args.setups.split(","):
        data = json.loads((args.out / setup.replace(":", "-") / "guidellm.json").read_text())
        runs.append((setup, data, 1 if setup == "single" else args.workers))
    write_reports(args, runs)
    return 0


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's shared-prefix shape and the engine twins' flags, which this runner and
    bench/inference_perf_run.py both take."""
    parser.add_argument("--prefixes", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=4096)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tpu", default="v6e")
    parser.add_argument("--topology", default="1x1")
    parser.add_argument("--chips-per-engine", type=int, default=1)
    parser.add_argument("--model-profile", default="llama-3.1-8b")
    parser.add_argument("--model", default="tpuserve/sim-8b", help="the served model's name")
    parser.add_argument(
        "--time-scale", type=float, default=1.0,
        help="the engine twins' real seconds per modelled second (reports are modelled; 0: steps "
        "back to back, reports in real seconds)",
    )  # fmt: skip
    parser.add_argument(
        "--stream-interval", type=int, default=1,
        help="the engines' --stream-interval (SGLang's): tokens per streamed chunk after the first",
    )  # fmt: skip
    parser.add_argument("--tokenizer", type=Path, help="a directory with tokenizer.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="router:precise,router:round_robin,single")
    parser.add_argument("--target", help="an endpoint already running (instead of --setups)")
    parser.add_argument("--workload", choices=("shared-prefix", *FIXED), default="shared-prefix")
    parser.add_argument(
        "--rate", type=_rates, default=[10.0],
        help="requests/s (constant), modelled seconds; several (1,2,4) run one benchmark "
        "each in one GuideLLM run and the summary adds the recipes' figure at the targets",
    )  # fmt: skip
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--max-requests", type=int, default=0, help="0: no limit")
    add_fleet_arguments(parser)
    parser.add_argument("--ttft-target-ms", type=float, default=1000.0, help="p99, modelled")
    parser.add_argument("--itl-target-ms", type=float, default=50.0, help="p99, modelled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidellm-arg", action="append", default=[])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "guidellm_results" / "latest")
    parser.add_argument(
        "--report", action="store_true",
        help="rebuild the reports and summary from --out's GuideLLM JSON files, running nothing",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.time_scale < 0:
        parser.error("--time-scale: must be >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        return report_only(args)
    tokenizer = args.tokenizer or tiny_tokenizer_dir()
    python = guidellm_python()
    runs = []
    setups = ["target"] if args.target else args.setups.split(",")
    for setup in setups:
        name = setup.replace(":", "-")
        if args.target:
            data = run_guidellm(python, args.target.rstrip("/"), args, tokenizer, name)
            runs.append((setup, data, args.workers))
        else:
            with started(setup, args, tokenizer) as (url, engines):
                before = router_counts(url) if setup.startswith("router:") else None
                runs.append((setup, run_guidellm(python, url, args, tokenizer, name), engines))
                if before is not None:
                    rate = router_hit_rate(before, router_counts(url))
                    (args.out / name / "router.json").write_text(
                        json.dumps({"router_prefix_cache_hit_rate": rate}) + "\n"
                    )
    write_reports(args, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
