"""Benchmark: SGLang-JAX's host KV tier on real engines (CPU) beside the twin, one workload.

Issue 67 item 6: two real SGLang-JAX engines (the opt-in CPU build, `scripts/build-sglang-jax.sh`,
tiny Qwen3) behind `tpuserve router`, a working set 2x the fleet's device KV pool, with and
without the host tier; then the engine twin (`tpuserve engine sim --flavor sglang-jax`) with
the same pools, the same router and the same requests. Each engine is started with the
command and environment the launcher plans for a contract on the cpu device (with
`TPUSERVE_HOST_KV_CACHE=write_through`, `TPUSERVE_HOST_KV_RATIO=R` for the tier), plus the
test build's small-pool flags.

The workload: D documents of L tokens, each asked Q times with its own 16-token question, in
one seeded random order, C requests in flight, 2 new tokens each, `/generate` with token ids.
SGLang-JAX publishes no KV events, so the router runs `--no-kv-events` (its approximate
record of what it sent where) for every setup, the twin too: the router does not know about
either engine's host tier, and the rows compare engines with and without it behind the same
router. Recorded per setup: the cached-token rate (cached prompt tokens over prompt tokens,
as the engines report them), request latency (wall clock on this machine for the real
engines; the twin's is its performance model of a TPU, not comparable in absolute terms),
and the engines' own count of host load backs where one says
(`sglang:cached_tokens_total{cache_source="host"}`: neither SGLang-JAX nor the twin's
SGLang-JAX flavour has it, so the column reads n/a).

    OUT=bench/host_tier_results/sgl-jax-cpu-2026-12-07
    .venv/bin/python bench/sgl_jax_host_tier_live.py --out $OUT
    .venv/bin/python bench/sgl_jax_host_tier_live.py --out DIR --setups twin-hbm-only,twin-host-tier
    .venv/bin/python bench/sgl_jax_host_tier_live.py --out DIR --table
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_tpu import launch  # noqa: E402
from sglang_tpu.contract.launch_contract import LaunchContract  # noqa: E402
from tpuserve.cluster.ports import LOOPBACK, free_port  # noqa: E402
from tpuserve.cluster.process import ManagedProcess  # noqa: E402

SETUPS = ("hbm-only", "host-tier", "twin-hbm-only", "twin-host-tier")
SERVED = "tiny-qwen3"
PAGE = 16
QUESTION_TOKENS = 16
TOKEN_IDS = range(100, 2000)  # ordinary ids of the tiny model's 2,048-token vocabulary
READY_SECONDS = 600.0
REQUEST_SECONDS = 600.0
# The opt-in build's small-pool flags (tests/real_sglang_jax.py's, the pool from --pool-tokens).
TEST_FLAGS = [
    *("--page-size", str(PAGE)),
    *("--max-running-requests", "8"),
    *("--chunked-prefill-size", "512"),
    *("--context-length", "2048"),
    *("--mem-fraction-static", "0.1"),
    "--skip-server-warmup",
    "--disable-precompile",
    "--sleep-on-idle",
]


@dataclass(frozen=True, slots=True)
class Workload:
    docs: int
    doc_tokens: int
    questions: int
    concurrency: int
    seed: int

    def requests(self) -> list[list[int]]:
        """Every (document, question) prompt as token ids, in the seeded order."""
        pairs = [(d, q) for d in range(self.docs) for q in range(self.questions)]
        random.Random(self.seed).shuffle(pairs)
        prompts = []
        for d, q in pairs:
            doc = random.Random(f"doc {self.seed} {d}").choices(TOKEN_IDS, k=self.doc_tokens)
            question = random.Random(f"q {self.seed} {d} {q}").choices(TOKEN_IDS, k=QUESTION_TOKENS)
            prompts.append(doc + question)
        return prompts


def build_paths() -> dict[str, str]:
    out = subprocess.run(
        [str(REPO / "scripts" / "build-sglang-jax.sh"), "--check"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


def real_engine(
    paths: dict[str, str], run: Path, name: str, pool: int, ratio: float | None
) -> tuple[ManagedProcess, str]:
    port = free_port()
    env = {
        "TPUSERVE_MODEL": paths["SGLANG_JAX_MODEL"],
        "TPUSERVE_TPU_GENERATION": "v5e",
        "TPUSERVE_TPU_TOPOLOGY": "1x1",
        "TPUSERVE_HOSTS": "1",
        "TPUSERVE_CHIPS_PER_HOST": "1",
        "TPUSERVE_HOST_INDEX": "0",
        "TPUSERVE_ENGINE": "sglang-jax",
        "TPUSERVE_DEVICE": "cpu",
        "TPUSERVE_SERVED_MODEL_NAME": SERVED,
        "TPUSERVE_BIND_HOST": LOOPBACK,
        "TPUSERVE_HTTP_PORT": str(port),
        "TPUSERVE_SGLANG_PYTHON": paths["SGLANG_JAX_PYTHON"],
    }
    if ratio is not None:
        env |= {"TPUSERVE_HOST_KV_CACHE": "write_through", "TPUSERVE_HOST_KV_RATIO": f"{ratio:g}"}
    contract = LaunchContract.from_env(env)
    plan = launch.plan(contract)
    inherited = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    inherited["JAX_COMPILATION_CACHE_DIR"] = str(
        Path(paths["SGLANG_JAX_PYTHON"]).parents[2] / "jax-cache"
    )
    server_env = launch.server_env(contract, plan, inherited)
    command = [*plan.command, *TEST_FLAGS, "--max-total-tokens", str(pool)]
    process = ManagedProcess.spawn(f"bench-{name}", command, run / f"{name}.log", env=server_env)
    return process, f"http://{LOOPBACK}:{port}"


def twin_engine(
    paths: dict[str, str], run: Path, name: str, pool: int, ratio: float | None
) -> tuple[ManagedProcess, str]:
    port = free_port()
    command = [
        sys.executable, "-m", "tpuserve", "engine", "sim", "--flavor", "sglang-jax",
        "--host", LOOPBACK, "--port", str(port), "--served-model-name", SERVED,
        "--tokenizer", str(Path(paths["SGLANG_JAX_MODEL"]) / "tokenizer.json"),
        "--tpu", "v5e", "--topology", "1x1", "--model-profile", "qwen3-0.6b",
        "--cache-tokens", str(pool), "--page-size", str(PAGE),
    ]  # fmt: skip
    if ratio is not None:
        command += ["--enable-hierarchical-cache", "--hicache-ratio", f"{ratio:g}"]
    process = ManagedProcess.spawn(f"bench-{name}", command, run / f"{name}.log")
    return process, f"http://{LOOPBACK}:{port}"


def wait_ok(url: str, process: ManagedProcess, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{url}: exited with {process.exit_code()} ({process.log_path})")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {seconds:.0f} s ({process.log_path})")


def router(run: Path, workers: list[str], tokenizer: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    command = [sys.executable, "-m", "tpuserve", "router", "--host", LOOPBACK, "--port", str(port)]
    for worker in workers:
        command += ["--worker", worker]
    command += [
        "--tokenizer", str(tokenizer), "--no-kv-events", "--load-poll-interval", "0.2",
        "--health-check-timeout", "10",
        "--first-byte-timeout-floor", str(REQUEST_SECONDS),
        "--request-timeout", str(REQUEST_SECONDS),
    ]  # fmt: skip
    process = ManagedProcess.spawn("bench-router", command, run / "router.log")
    return process, f"http://{LOOPBACK}:{port}"


def generate(url: str, ids: list[int]) -> dict[str, Any]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    request = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_SECONDS) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{url}/generate: {err.code} {err.read().decode()[:500]}") from err
    meta = answer["meta_info"]
    return {
        "prompt_tokens": int(meta["prompt_tokens"]),
        "cached_tokens": int(meta.get("cached_tokens") or 0),
        "seconds": time.monotonic() - start,
    }


def host_cached_tokens(url: str) -> float | None:
    """`sglang:cached_tokens_total{cache_source="host"}` where the engine has it (the twin)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.findall(r'sglang:cached_tokens_total\{[^}]*cache_source="host"[^}]*\} (\S+)', text)
    return sum(float(v) for v in found) if found else None


def run_setup(setup: str, args: argparse.Namespace, paths: dict[str, str]) -> dict[str, Any]:
    ratio = args.host_ratio if setup.endswith("host-tier") else None
    start_engine = twin_engine if setup.startswith("twin") else real_engine
    with tempfile.TemporaryDirectory(prefix=f"sgljax-tier-{setup}-") as tmp:
        run = Path(tmp)
        started = [
            start_engine(paths, run, f"engine{i}", args.pool_tokens, ratio)
            for i in range(args.engines)
        ]
        processes = [p for p, _ in started]
        urls = [u for _, u in started]
        try:
            for process, url in started:
                wait_ok(f"{url}/health", process, READY_SECONDS)
            tokenizer = Path(paths["SGLANG_JAX_MODEL"]) / "tokenizer.json"
            router_process, router_url = router(run, urls, tokenizer)
            processes.append(router_process)
            wait_ok(f"{router_url}/health", router_process, 120)
            workload = Workload(
                args.docs, args.doc_tokens, args.questions, args.concurrency, args.seed
            )
            prompts = workload.requests()
            began = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                records = list(pool.map(lambda ids: generate(router_url, ids), prompts))
            wall = time.monotonic() - began
            host = [host_cached_tokens(u) for u in urls]
            alive = all(p.alive() for p in processes)
        finally:
            for process in reversed(processes):
                process.stop(30)
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    seconds = sorted(r["seconds"] for r in records)
    known_host = [h for h in host if h is not None]
    working_set = args.docs * args.doc_tokens
    return {
        "setup": setup,
        "engines": args.engines,
        "pool_tokens_per_engine": args.pool_tokens,
        "host_ratio": ratio,
        "workload": asdict(workload),
        "working_set_over_fleet_pool": working_set / (args.engines * args.pool_tokens),
        "requests": len(records),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt,
        "host_cached_tokens": sum(known_host) if known_host else None,
        "latency_mean_s": statistics.fmean(seconds),
        "latency_p50_s": seconds[len(seconds) // 2],
        "latency_p90_s": seconds[int(len(seconds) * 0.9)],
        "wall_s": wall,
        "engines_alive_after": alive,
        "records": records,
    }


def table(out: Path) -> str:
    rows = [
        "| setup | hit rate | host-loaded tokens | latency mean s | p50 s | p90 s | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for setup in SETUPS:
        path = out / f"{setup}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        host = "n/a" if r["host_cached_tokens"] is None else f"{r['host_cached_tokens']:.0f}"
        rows.append(
            f"| {setup} | {r['hit_rate']:.3f} | {host} | {r['latency_mean_s']:.3f} | "
            f"{r['latency_p50_s']:.3f} | {r['latency_p90_s']:.3f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--pool-tokens", type=int, default=1024)
    parser.add_argument("--host-ratio", type=float, default=4.0)
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--doc-tokens", type=int, default=256)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="print the committed rows")
    args = parser.parse_args()
    if args.table:
        print(table(args.out))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    paths = build_paths()
    for setup in args.setups.split(","):
        if setup not in SETUPS:
            parser.error(f"--setups: {setup!r} is not one of {', '.join(SETUPS)}")
        result = run_setup(setup, args, paths)
        result["command"] = " ".join(["bench/sgl_jax_host_tier_live.py", *sys.argv[1:]])
        (args.out / f"{setup}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"{setup}: hit rate {result['hit_rate']:.3f}, mean {result['latency_mean_s']:.3f} s")
    print(table(args.out))


if __name__ == "__main__":
    main()
