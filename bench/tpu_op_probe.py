"""Single-op probes on a TPU chip, one process each (a TPU compiler abort ends the process).

    python bench/tpu_op_probe.py --out FILE            # every probe, each in a child process
    python bench/tpu_op_probe.py --one NAME --out FILE  # one probe in this process

Each probe is the smallest program that reproduces a step of SGLang's Qwen3 path that the
chip's compiler refused in bench/tpu_real_model.py (docs/tpu-lane.md): the host transfer of
int64 argmax ids, and the cumsum of int64 sequence lengths that SGLang's LogitsProcessor does,
in the strict eager mode and in DeferAndFuse. One JSON line per probe: ok, or the abort's
check message.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def _probes() -> dict[str, Callable[[], Any]]:
    import torch

    d = torch.device("tpu")

    def argmax_int64_to_host() -> Any:
        return torch.argmax(torch.randn(2, 512, device=d), dim=-1).cpu()

    def argmax_after_index_to_host() -> Any:
        h = torch.randn(32, 128, device=d)
        lens = torch.tensor([16, 16], device=d)
        last = torch.cumsum(lens, dim=0) - 1
        logits = h[last] @ torch.randn(128, 512, device=d)
        return torch.argmax(logits, dim=-1).cpu()

    def argmax_int32_to_host() -> Any:
        return torch.argmax(torch.randn(2, 512, device=d), dim=-1).to(torch.int32).cpu()

    def int64_vector_to_host() -> Any:
        return torch.arange(2, device=d).cpu()

    def int64_from_host_and_back() -> Any:
        return torch.tensor([3, 5], dtype=torch.int64).to(d).cpu()

    def cumsum_int64() -> Any:
        return torch.cumsum(torch.tensor([16, 16], device=d), dim=0).cpu()

    def cumsum_int32() -> Any:
        return torch.cumsum(torch.tensor([16, 16], dtype=torch.int32, device=d), dim=0).cpu()

    def cumsum_float() -> Any:
        return torch.cumsum(torch.tensor([16.0, 16.0], device=d), dim=0).cpu()

    return {
        f.__name__: f
        for f in (
            argmax_int64_to_host,
            argmax_after_index_to_host,
            argmax_int32_to_host,
            int64_vector_to_host,
            int64_from_host_and_back,
            cumsum_int64,
            cumsum_int32,
            cumsum_float,
        )
    }


NAMES = [
    "argmax_int64_to_host",
    "argmax_after_index_to_host",
    "argmax_int32_to_host",
    "int64_vector_to_host",
    "int64_from_host_and_back",
    "cumsum_int64",
    "cumsum_int32",
    "cumsum_float",
]
MODES = ["DEFER_NEVER", "DEFER_AND_FUSE"]


def one(name: str, mode: str) -> dict[str, Any]:
    import torch
    import torch_tpu  # noqa: F401

    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    t = time.perf_counter()
    try:
        out = _probes()[name]()
        torch.accelerator.synchronize()
        return {
            "probe": name,
            "mode": mode,
            "ok": True,
            "result": out.tolist(),
            "dtype": str(out.dtype),
            "s": round(time.perf_counter() - t, 3),
        }
    except Exception as e:  # a Python error, not an abort
        return {"probe": name, "mode": mode, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one")
    ap.add_argument("--mode", default="DEFER_NEVER")
    ap.add_argument("--out", required=True)
    ap.add_argument("--names", nargs="*", default=NAMES)
    ap.add_argument("--modes", nargs="*", default=MODES)
    a = ap.parse_args()
    if a.one:
        rec = one(a.one, a.mode)
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return 0
    for mode in a.modes:
        for name in a.names:
            p = subprocess.run(
                [sys.executable, __file__, "--one", name, "--mode", mode, "--out", a.out],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if p.returncode != 0:
                err = p.stdout + p.stderr
                checks = re.findall(r"F\d{4} [^\n]*\] (Check failed[^\n]*)", err)
                with open(a.out, "a") as f:
                    f.write(
                        json.dumps(
                            {
                                "probe": name,
                                "mode": mode,
                                "ok": False,
                                "abort": True,
                                "rc": p.returncode,
                                "check": checks[:2],
                                "tail": err[-600:],
                            }
                        )
                        + "\n"
                    )
            print(name, mode, p.returncode, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
