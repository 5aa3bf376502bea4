"""Benchmark report: real model code's step on the chip against the performance model (issue 58).

Reads the lane's committed results of `bench/tpu_real_model.py` (Transformers' Qwen3 on one
TPU v5e chip, `bench/tpu_results/v5e-2026-12-06b/results.json`) and puts each measured step
(median of 5 synchronised calls: a prefill from an empty cache, then a decode step, each
ending with the greedy ids' copy to the host) beside what `sglang_tpu.perf_model` says for the
same step on a v5e `1x1`: the device half (`StepTimer.device_seconds`, fitted to bare
compiled decoder steps), the host half (`host_seconds`, fitted to published engines), and
what the real step took beyond the device half. The two shapes' profiles come from their
Qwen3 config keys (`tpu_real_model.SHAPES`) through `sglang_tpu.model_config`, as a user's
model does; the tiny shape ran in float32, timed here as bf16 (its step is the fixed cost).

The eager modes' extra time per layer ((eager - compiled) / layers, per shape and step) is
what `perf_model.EAGER_LAYER_SECONDS` holds (their median); `--json` prints it.

    .venv/bin/python bench/real_model_gap.py            # the table (markdown)
    .venv/bin/python bench/real_model_gap.py --json     # rows and the per-layer figure
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_tpu import model_config
from sglang_tpu.perf_model import StepTimer
from sglang_tpu.topology import lookup

HERE = Path(__file__).resolve().parent


def _shapes() -> dict[str, dict[str, Any]]:
    """`bench/tpu_real_model.py`'s SHAPES (its Qwen3 config keys; that script imports torch
    only inside its functions)."""
    spec = importlib.util.spec_from_file_location("_gap_tpu_real_model", HERE / "tpu_real_model.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shapes: dict[str, dict[str, Any]] = module.SHAPES
    return shapes


SHAPES = _shapes()
RESULTS = HERE / "tpu_results" / "v5e-2026-12-06b" / "results.json"
DECODE_STEPS_BEFORE_MEDIAN = 3
"""The timed decode repeats run at prompt + 1 ... prompt + 5 tokens: the median's context."""
MODE_LABELS = {
    "eager": "strict eager (DEFER_NEVER)",
    "fuse": "DEFER_AND_FUSE",
    "compile": 'torch.compile(backend="tpu")',
}


@dataclass(frozen=True, slots=True)
class Gap:
    impl: str
    shape: str
    mode: str
    precision: str | None
    step: str  # prefill | decode
    measured_ms: float
    device_ms: float
    host_ms: float

    @property
    def beyond_device_ms(self) -> float:
        return self.measured_ms - self.device_ms

    @property
    def model_ms(self) -> float:
        return self.device_ms + self.host_ms


def timer_for(shape: str) -> StepTimer:
    profile = model_config.profile_from_config(SHAPES[shape], f"SHAPES[{shape!r}]", shape)
    return StepTimer(lookup("v5e", "1x1"), profile, "bf16")


def gaps(results: dict[str, Any]) -> list[Gap]:
    """One row per (run, step) with step times; runs without them (the launch-blocking mode,
    SGLang's aborts) have none."""
    rows: list[Gap] = []
    for run in results["tpu_runs"]:
        if run["prefill_ms"] is None:
            continue
        timer = timer_for(run["shape"])
        batch, prompt = run["batch"], run["prompt_len"]
        attention = batch * prompt * (prompt + 1) // 2
        prefill_device = timer.device_seconds(batch * prompt, attention)
        context = batch * (prompt + DECODE_STEPS_BEFORE_MEDIAN)
        decode_device = timer.device_seconds(decode_batch=batch, decode_context=context)
        common = (run["impl"], run["shape"], run["mode"], run["float32_matmul_precision"])
        rows.append(
            Gap(*common, "prefill", run["prefill_ms"], 1e3 * prefill_device,
                1e3 * timer.host_seconds(batch))
        )  # fmt: skip
        rows.append(
            Gap(*common, "decode", run["decode_ms"], 1e3 * decode_device,
                1e3 * timer.host_seconds(batch))
        )  # fmt: skip
    return rows


def eager_layer_ms(rows: list[Gap]) -> list[float]:
    """(eager - compiled) / layers for each shape and step measured both ways (default
    precision): what an eager step adds per layer over the compiled one."""
    compiled = {(r.shape, r.step): r.measured_ms for r in rows if r.mode == "compile"}
    out = []
    for r in rows:
        if r.mode in ("eager", "fuse") and r.precision is None and (r.shape, r.step) in compiled:
            layers = SHAPES[r.shape]["num_hidden_layers"]
            out.append((r.measured_ms - compiled[(r.shape, r.step)]) / layers)
    return out


def markdown(rows: list[Gap]) -> str:
    lines = [
        "| shape | mode | step | measured ms | model device ms | measured / device "
        "| beyond device ms | model device + host ms | measured / model |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mode = MODE_LABELS[r.mode] + (f", {r.precision}" if r.precision else "")
        lines.append(
            f"| {r.shape} | {mode} | {r.step} | {r.measured_ms:.2f} | {r.device_ms:.2f} "
            f"| {r.measured_ms / r.device_ms:.1f}x | {r.beyond_device_ms:.2f} "
            f"| {r.model_ms:.2f} | {r.measured_ms / r.model_ms:.2f} |"
        )
    per_layer = eager_layer_ms(rows)
    lines += [
        "",
        f"Eager over compiled, per layer and step: {', '.join(f'{v:.2f}' for v in per_layer)} ms "
        f"(median {statistics.median(per_layer):.2f} ms).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = gaps(json.loads(args.results.read_text()))
    if args.json:
        for r in rows:
            print(json.dumps(_asdict(r)))
        per_layer = eager_layer_ms(rows)
        print(json.dumps({"eager_layer_ms": per_layer, "median": statistics.median(per_layer)}))
        return
    print(markdown(rows))


def _asdict(r: Gap) -> dict[str, Any]:
    return {
        "impl": r.impl, "shape": r.shape, "mode": r.mode, "precision": r.precision,
        "step": r.step, "measured_ms": r.measured_ms, "device_ms": round(r.device_ms, 3),
        "host_ms": round(r.host_ms, 3), "beyond_device_ms": round(r.beyond_device_ms, 3),
    }  # fmt: skip


if __name__ == "__main__":
    main()
