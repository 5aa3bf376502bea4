"""Where SGLang's compiled step goes wrong on TorchTPU (issue 71, item 1; docs/tpu-lane.md).

    TORCH_LOGS=graph_breaks python bench/tpu_compile_diagnosis.py --device tpu --out FILE \
        [--shape tiny] [--eager-kv-writes] [--host-cumsum] [--precision highest]

One process, one JSON line. SGLang 0.5.23's `Qwen3ForCausalLM` through the adapter
(`sglang_tpu.sglang_torchtpu.SGLangQwen3Runner`, as `bench/tpu_real_model.py` builds it) runs a
prefill and one decode step **eagerly**, then, with the KV pool zeroed, the same prefill and
decode step through ``torch.compile(backend=...)`` (``tpu`` on the chip). Recorded:

- both passes' logits (prefill, decode): the largest difference, argmax per sequence, whether
  the compiled ones are all zero or not finite, their norms;
- the KV pool after each pass at the prompt's slots (layer 0 and the last layer): whether the
  compiled pass wrote anything there (``kv_landed``: non-zero, and close to the eager pass's);
- Dynamo's counters: every graph break's reason (``graph_break``) and the graphs it made
  (``stats``), beside what ``TORCH_LOGS=graph_breaks`` prints to stderr.

``--eager-kv-writes`` wraps `MHATokenToKVPool.set_kv_buffer` in ``torch.compiler.disable``: the
pool's index writes then run eagerly (a graph break at each), so a pool write that does not
land in the compiled graph is told from a wrong graph: if the compiled logits are right only
with it, the writes were the fault. ``--backend eager`` (Dynamo without a compiler) runs the
same on a CPU, to test this script.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _logits_report(eager: Any, compiled: Any) -> dict[str, Any]:
    import torch

    e, c = eager.float().cpu(), compiled.float().cpu()
    finite = bool(torch.isfinite(c).all())
    diff = (e - c).abs()
    return {
        "max_abs_diff": float(diff.max()) if finite else None,
        "max_abs_eager": float(e.abs().max()),
        "compiled_all_zero": bool((c == 0).all()),
        "compiled_finite": finite,
        "norm_eager": float(e.norm()),
        "norm_compiled": float(c.norm()) if finite else None,
        "argmax_eager": e.argmax(-1).tolist(),
        "argmax_compiled": c.argmax(-1).tolist(),
        "argmax_equal": bool((e.argmax(-1) == c.argmax(-1)).all()),
    }


def _kv_at(runner: Any, slots: Any) -> list[Any]:
    pool = runner.kv_pool
    layers = (0, len(pool.k_buffer) - 1)
    return [pool.k_buffer[i][slots].float().cpu() for i in layers] + [
        pool.v_buffer[i][slots].float().cpu() for i in layers
    ]


def _zero_pool(runner: Any) -> None:
    for buffer in (*runner.kv_pool.k_buffer, *runner.kv_pool.v_buffer):
        buffer.zero_()


def diagnose(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(HERE))
    real_model = importlib.import_module("tpu_real_model")  # its shapes, stand-ins and weights
    SHAPES, STUBBABLE, build_hf = real_model.SHAPES, real_model.STUBBABLE, real_model.build_hf

    rec: dict[str, Any] = {
        "device": args.device,
        "shape": args.shape,
        "backend": args.backend,
        "eager_kv_writes": args.eager_kv_writes,
        "torch": torch.__version__,
        "torch_logs": os.environ.get("TORCH_LOGS", ""),
    }
    if args.device == "tpu":
        import torch_tpu

        rec["torch_tpu"] = getattr(torch_tpu, "__version__", "?")
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    dtype = torch.float32 if args.shape == "tiny" else torch.bfloat16
    if args.precision:
        torch.set_float32_matmul_precision(args.precision)
    from sglang_tpu.cpu_shim import PYTHONPATH_ENTRY
    from sglang_tpu.sglang_torchtpu import (
        SGLangQwen3Runner,
        install_missing_module_stubs,
        route_integer_cumsum_through_host,
        tolerate_missing_processor_backends,
    )

    sys.path.append(str(PYTHONPATH_ENTRY))
    hf_model = build_hf(args.shape, dtype)[1]
    install_missing_module_stubs(STUBBABLE)
    tolerate_missing_processor_backends()
    if args.host_cumsum:
        route_integer_cumsum_through_host()
    if args.eager_kv_writes:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        MHATokenToKVPool.set_kv_buffer = torch.compiler.disable(MHATokenToKVPool.set_kv_buffer)
    batch, prompt_len = (2, 16) if args.shape == "tiny" else (8, 128)
    runner = SGLangQwen3Runner(
        SHAPES[args.shape], hf_model, device=args.device, dtype=dtype,
        max_context=prompt_len + 8, batch=batch,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, SHAPES[args.shape]["vocab_size"], (batch, prompt_len), generator=gen)
    ids = prompt.to(args.device)
    slots = runner._slots[:, :prompt_len].reshape(-1).to(args.device)

    def two_steps() -> tuple[Any, Any, list[Any]]:
        logits = runner.prefill(ids)
        kv = _kv_at(runner, slots)
        nxt = torch.argmax(logits, dim=-1)
        return logits, runner.decode(nxt), kv

    t = time.perf_counter()
    pre_e, dec_e, kv_e = two_steps()
    rec["eager_s"] = round(time.perf_counter() - t, 3)
    _zero_pool(runner)
    torch._dynamo.reset()
    runner._forward = torch.compile(runner._plain_forward, backend=args.backend)
    t = time.perf_counter()
    pre_c, dec_c, kv_c = two_steps()
    rec["compiled_s"] = round(time.perf_counter() - t, 3)
    rec["prefill"] = _logits_report(pre_e, pre_c)
    rec["decode"] = _logits_report(dec_e, dec_c)
    rec["kv_landed"] = {
        name: {
            "nonzero_compiled": bool((c != 0).any()),
            "max_abs_diff": float((e - c).abs().max()),
            "max_abs_eager": float(e.abs().max()),
        }
        for name, e, c in zip(("k_first", "k_last", "v_first", "v_last"), kv_e, kv_c, strict=True)
    }
    from torch._dynamo.utils import counters

    rec["graph_breaks"] = {str(k): v for k, v in counters["graph_break"].items()}
    rec["dynamo_stats"] = {str(k): v for k, v in counters["stats"].items()}
    rec["ok"] = True
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="tpu", help="torch.compile backend (eager: a CPU test)")
    ap.add_argument("--shape", default="tiny", choices=["tiny", "qwen3-0.6b-4l"])
    ap.add_argument("--eager-kv-writes", action="store_true")
    ap.add_argument("--host-cumsum", action="store_true")
    ap.add_argument("--precision", choices=["highest", "high", "medium"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        rec = diagnose(args)
    except Exception as err:  # a Python error (not an abort): recorded, not raised
        rec = {
            "device": args.device, "eager_kv_writes": args.eager_kv_writes, "ok": False,
            "error": f"{type(err).__name__}: {err}"[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }  # fmt: skip
    with open(args.out, "a") as handle:
        handle.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "traceback"})[:4000], flush=True)
    return 0 if rec.get("ok") else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    sys.exit(main())
