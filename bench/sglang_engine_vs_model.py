"""Sum up the SGLang-engine-on-the-chip calls (issue 71, item 2) against the performance model.

    python bench/sglang_engine_vs_model.py DIR [--check]

Reads ``DIR/call*-engine.jsonl`` (`bench/sglang_engine_chip.py`'s rows), writes
``DIR/results.json``: per run, its tokens against the CPU reference run's (``cpu-ref``, the
same machine) and its answers' cached tokens; per timed decode row, the measured step next to
`StepTimer`'s step for that model shape on a v5e 1x1 (``compiled`` for the compiled runs,
``eager`` for the eager ones; context: the batch's prompts plus half the new tokens) and the
model's error, (predicted - measured) / measured; and SGLang-JAX's decode on the same chip
(28 layers; docs/tpu-lane.md). ``--check`` fails when results.json is not what the rows give.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.sglang_jax_models import QWEN3_COMMON, SHAPES  # noqa: E402
from sglang_tpu import model_config  # noqa: E402
from sglang_tpu.perf_model import StepTimer  # noqa: E402
from sglang_tpu.topology import lookup  # noqa: E402

PERF_PROMPT = 64  # bench/sglang_engine_chip.py's --perf-prompt default (every call used it)
MODEL_LAYERS = {"tiny": ("tiny", None), "qwen3-0.6b-4l": ("qwen3-0.6b", 4)}
SGLANG_JAX_DECODE_MS = {1: 6.54, 8: 6.24, 32: 7.56}  # v5e-2026-12-07-sglang-jax, 28 layers


def timer(model: str, mode: str) -> StepTimer:
    shape, layers = MODEL_LAYERS[model]
    cfg = dict(QWEN3_COMMON, **SHAPES[shape])
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    profile = model_config.profile_from_config(cfg, f"SHAPES[{shape!r}]", model)
    return StepTimer(lookup("v5e", "1x1"), profile, "bf16", execution_mode=mode)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    runs: dict[str, dict[str, Any]] = {}
    label = None
    for r in rows:
        if "label" in r:
            label = r["label"]
        if label is None:
            continue
        run = runs.setdefault(label, {"tokens": [], "decode": [], "error": None})
        if r.get("phase") == "start":
            run.update(model=r["model"], compile=r["compile"], device=r["device"])
            run["ready_s"] = r.get("ready_s")
        elif r.get("phase") == "error":
            run["error"] = r["error"]
        elif r.get("phase") == "tokens":
            run["tokens"].append(r)
        elif r.get("phase") == "perf" and r.get("round") == "timed":
            run["decode"].append(r)
    ref = [t["output_ids"] for t in runs.get("cpu-ref", {}).get("tokens", [])]
    out: dict[str, Any] = {"runs": {}, "decode_rows": []}
    for name, run in runs.items():
        ids = [t["output_ids"] for t in run["tokens"]]
        equal = sum(
            a == b for x, y in zip(ids, ref, strict=False) for a, b in zip(x, y, strict=False)
        )
        out["runs"][name] = {
            "model": run.get("model"),
            "compile": run.get("compile"),
            "ready_s": run.get("ready_s"),
            "error": run["error"],
            "answers": len(ids),
            "tokens_equal_to_cpu_ref": f"{equal} of {sum(len(x) for x in ids)}" if ids else None,
            "cached_tokens": [t["cached_tokens"] for t in run["tokens"]],
            "prompt_tokens": [t["prompt_tokens"] for t in run["tokens"]],
        }
        if run.get("device") != "tpu":
            continue
        mode = "compiled" if run["compile"] else "eager"
        t = timer(run["model"], mode)
        for d in run["decode"]:
            b = d["batch"]
            new = d["decode_steps_at_batch"] + 1
            context = b * (PERF_PROMPT + new // 2)
            device = t.device_seconds(decode_batch=b, decode_context=context)
            predicted = 1e3 * (device + t.host_seconds(b))
            measured = d["decode_ms_median"]
            out["decode_rows"].append(
                {
                    "run": name,
                    "model": run["model"],
                    "mode": "compiled" if run["compile"] else "eager",
                    "batch": b,
                    "measured_ms": measured,
                    "model_ms": round(predicted, 2),
                    "model_device_ms": round(1e3 * device, 3),
                    "error": round((predicted - measured) / measured, 3),
                    "sglang_jax_28_layers_ms": SGLANG_JAX_DECODE_MS.get(b),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for f in sorted(args.dir.glob("call[0-9]-engine.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    text = json.dumps(summarise(rows), indent=1) + "\n"
    target = args.dir / "results.json"
    if args.check:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: rerun bench/sglang_engine_vs_model.py {args.dir}")
            return 1
        return 0
    target.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
