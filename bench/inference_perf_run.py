"""inference-perf (kubernetes-sigs' benchmark client) against tpuserve: router policies, one engine.

The second of the field's clients beside GuideLLM (``bench/guidellm_run.py``, whose setups,
engine flags and tokenizer this script shares): inference-perf, the client llm-d and GKE
publish with, run unchanged from its own virtual environment (``bench/inference_perf_venv.sh``;
its releases need Python >= 3.12). Each run keeps inference-perf's own reports (its summary
lifecycle metrics and, per stage, its partial llm-d benchmark report v0.2, which the client
writes itself) and adds one line the way TPU serving recipes report: output tokens per
second per chip, at the TTFT and ITL served, against the targets.

Setups as GuideLLM's (``router:POLICY``: ``tpuserve up``; ``single``: one engine twin; or
``--target URL``). Workloads: the fixed ``1k1k``, ``1k8k``, ``8k1k`` (inference-perf's
``random`` data with a fixed length) and ``shared-prefix`` (its ``shared_prefix`` data:
``--prefixes`` groups of ``--prefix-tokens``, ``--prompt-tokens`` each, ``--output-tokens``).
One constant-rate stage of ``--max-seconds`` (inference-perf's stages are timed); as in
``guidellm_run.py``, ``--rate`` and the reports are in the twins' modelled seconds.

    bench/inference_perf_venv.sh                                  # once (TOOL_PYTHON=python3.12)
    .venv/bin/python bench/inference_perf_run.py --workload 1k1k --rate 2 --max-seconds 20 \\
        --setups router:precise,single --out bench/guidellm_results/ip-run1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _guidellm_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_inference_perf_guidellm_run", ROOT / "bench" / "guidellm_run.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


shared = _guidellm_run()


def inference_perf_python() -> str:
    """The inference-perf environment's python (installs it the first time)."""
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "inference_perf_venv.sh")], check=True,
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def _fixed(n: int) -> dict[str, Any]:
    """inference-perf's distribution pinned to one value."""
    return {"min": n, "max": n, "mean": n, "std_dev": 0}


def data_config(args: argparse.Namespace) -> dict[str, Any]:
    if args.workload in shared.FIXED:
        prompt, output = shared.FIXED[args.workload]
        return {"type": "random", "input_distribution": _fixed(prompt),
                "output_distribution": _fixed(output)}  # fmt: skip
    per_group = max(1, int(args.rate * args.max_seconds / args.prefixes) + 1)
    return {
        "type": "shared_prefix",
        "shared_prefix": {
            "num_groups": args.prefixes, "num_prompts_per_group": per_group,
            "system_prompt_len": args.prefix_tokens, "question_len": args.prompt_tokens,
            "output_len": args.output_tokens, "seed": args.seed,
        },
    }  # fmt: skip


def config(url: str, args: argparse.Namespace, tokenizer: Path, out: Path) -> dict[str, Any]:
    """An inference-perf config file (``inference-perf -c FILE``): one constant-rate stage."""
    return {
        "api": {"type": "chat", "streaming": True},
        "data": data_config(args),
        "load": {
            "type": "constant",
            "stages": [{"rate": args.rate / shared.clock(args), "duration": args.max_seconds}],
            "num_workers": args.client_workers,
        },
        "server": {"type": "sglang", "model_name": args.model, "base_url": url,
                   "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": True,
                                         "per_request": False}},
        "storage": {"local_storage": {"path": str(out)}},
    }  # fmt: skip


def run_inference_perf(
    python: str, url: str, args: argparse.Namespace, tokenizer: Path, name: str
) -> dict[str, Any]:
    """Run one setup; inference-perf's summary lifecycle report."""
    out_dir = args.out / name
    reports = out_dir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    spec = out_dir / "config.json"  # YAML's superset: inference-perf reads it as YAML
    spec.write_text(json.dumps(config(url, args, tokenizer, reports), indent=1) + "\n")
    tool = str(Path(python).parent / "inference-perf")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with (out_dir / "inference-perf.log").open("w") as log:
        subprocess.run([tool, "-c", str(spec)], check=True, stdout=log,
                       stderr=subprocess.STDOUT, env=env)  # fmt: skip
    return summary_report(reports)


def summary_report(reports: Path) -> dict[str, Any]:
    found = sorted(reports.rglob("summary_lifecycle_metrics.json"))
    if not found:
        raise SystemExit(f"{reports}: inference-perf wrote no summary_lifecycle_metrics.json")
    data: dict[str, Any] = json.loads(found[-1].read_text())
    return data


def _stat(summary: dict[str, Any] | None, key: str, scale: float) -> float | None:
    value = (summary or {}).get(key)
    return value * scale if isinstance(value, int | float) else None


def hit_rate(successes: dict[str, Any]) -> float | None:
    """Cached / prompt tokens where inference-perf's summary has them (from the engines'
    ``usage.prompt_tokens_details.cached_tokens``)."""
    prompt = successes.get("prompt_tokens") or {}
    total, cached = prompt.get("total"), prompt.get("cached")
    if not isinstance(total, int | float) or not isinstance(cached, int | float) or total <= 0:
        return None
    return cached / total


def summary_row(
    report: dict[str, Any], setup: str, chips: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The TPU recipes' line from inference-perf's summary, in the twins' modelled time
    (its seconds / the clock; throughputs x the clock)."""
    clock = shared.clock(args)
    ok = report.get("successes", {})
    failures = report.get("failures", {})
    lat = ok.get("latency", {})
    ms = 1000.0 / clock
    out_tps = (ok.get("throughput", {}).get("output_tokens_per_sec") or 0.0) * clock
    ttft, itl = lat.get("time_to_first_token"), lat.get("inter_token_latency")
    ttft_p99, itl_p99 = _stat(ttft, "p99", ms), _stat(itl, "p99", ms)
    return {
        "setup": setup,
        "chips": chips,
        "requests": ok.get("count", 0) + failures.get("count", 0),
        "completed": ok.get("count", 0),
        "failures": failures.get("count", 0),
        "output_tokens_per_second": out_tps,
        "output_tokens_per_second_per_chip": out_tps / chips,
        "ttft_p50_ms": _stat(ttft, "median", ms),
        "ttft_p99_ms": ttft_p99,
        "itl_p50_ms": _stat(itl, "median", ms),
        "itl_p99_ms": itl_p99,
        "hit_rate": hit_rate(ok),
        "ttft_target_ms": args.ttft_target_ms,
        "ttft_target_met": ttft_p99 is not None and ttft_p99 <= args.ttft_target_ms,
        "itl_target_ms": args.itl_target_ms,
        "itl_target_met": itl_p99 is not None and itl_p99 <= args.itl_target_ms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="router:precise,router:round_robin,single")
    parser.add_argument("--target", help="an endpoint already running (instead of --setups)")
    parser.add_argument("--workload", choices=("shared-prefix", *shared.FIXED), default="1k1k")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s, modelled seconds")
    parser.add_argument("--max-seconds", type=int, default=30, help="the stage, real seconds")
    shared.add_fleet_arguments(parser)
    parser.add_argument("--client-workers", type=int, default=1, help="inference-perf's")
    parser.add_argument("--ttft-target-ms", type=float, default=1000.0, help="p99, modelled")
    parser.add_argument("--itl-target-ms", type=float, default=50.0, help="p99, modelled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "guidellm_results" / "ip")
    args = parser.parse_args(argv)
    if args.time_scale < 0:
        parser.error("--time-scale: must be >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer or shared.tiny_tokenizer_dir()
    python = inference_perf_python()
    rows = []
    for setup in ["target"] if args.target else args.setups.split(","):
        name = setup.replace(":", "-")
        if args.target:
            report = run_inference_perf(python, args.target.rstrip("/"), args, tokenizer, name)
            engines = args.workers
        else:
            with shared.started(setup, args, tokenizer) as (url, engines):
                report = run_inference_perf(python, url, args, tokenizer, name)
        rows.append(summary_row(report, setup, engines * args.chips_per_engine, args))
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(shared.markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
