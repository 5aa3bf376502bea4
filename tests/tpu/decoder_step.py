"""One decoder step compiled with TorchTPU, timed: the TPU lane's compile-cache workload.

`python3 decoder_step.py [--layers 28 --batch 8 --context 1024]` builds a decoder of
Qwen3-0.6B's shape (hidden 1024, 16 query / 8 KV heads of 128, MLP 3072, vocabulary 151936;
RMSNorm in f32, GQA, SwiGLU, tied embeddings; random bf16 weights), compiles its decode step
(one new token per sequence over `context` cached positions, attention over the cache and the
new token, greedy argmax) with `torch.compile(backend="tpu")`, and prints one JSON line:
the first call's seconds (compile plus one step) and the median of the next calls. Run it
with the launcher's compile-cache variables to see what a second process finds warm.
Errors after torch's import are printed as JSON too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from typing import Any

import torch

MARKER = "TPUSERVE_DECODER_STEP"


HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 1024, 16, 8, 128, 3072, 151936


def rms(x: Any, weight: Any) -> Any:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return xf.to(x.dtype) * weight


class Layer(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        linear = torch.nn.Linear
        self.q = linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k = linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v = linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o = linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate = linear(HIDDEN, MLP, bias=False)
        self.up = linear(HIDDEN, MLP, bias=False)
        self.down = linear(MLP, HIDDEN, bias=False)
        self.norm1 = torch.nn.Parameter(torch.ones(HIDDEN))
        self.norm2 = torch.nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x: Any, k_cache: Any, v_cache: Any) -> Any:
        batch = x.shape[0]
        y = rms(x, self.norm1)
        q = self.q(y).view(batch, 1, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(y).view(batch, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v(y).view(batch, 1, KV_HEADS, HEAD_DIM).transpose(1, 2)
        keys = torch.cat([k_cache, k], dim=2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        values = torch.cat([v_cache, v], dim=2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = (q.float() @ keys.float().transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        attended = scores.softmax(-1).to(x.dtype) @ values
        x = x + self.o(attended.transpose(1, 2).reshape(batch, 1, HEADS * HEAD_DIM))
        y = rms(x, self.norm2)
        return x + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


class Decoder(torch.nn.Module):  # type: ignore[misc]
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList([Layer() for _ in range(layers)])
        self.norm = torch.nn.Parameter(torch.ones(HIDDEN))

    def forward(self, tokens: Any, k_caches: Any, v_caches: Any) -> Any:
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, k_caches[i], v_caches[i])
        logits = rms(x, self.norm) @ self.embed.weight.t()
        return logits.argmax(-1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--backend", default="tpu")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"layers": args.layers, "batch": args.batch, "context": args.context}
    try:
        torch.manual_seed(0)
        model = Decoder(args.layers).to(dtype=torch.bfloat16).to(args.device).eval()
        cache_shape = (args.layers, args.batch, KV_HEADS, args.context, HEAD_DIM)
        k_caches = torch.zeros(cache_shape, dtype=torch.bfloat16, device=args.device)
        v_caches = torch.zeros(cache_shape, dtype=torch.bfloat16, device=args.device)
        tokens = torch.zeros((args.batch, 1), dtype=torch.long, device=args.device)
        step = torch.compile(model, backend=args.backend)

        def call() -> float:
            started = time.perf_counter()
            with torch.no_grad():
                result = step(tokens, k_caches, v_caches)
            if args.device != "cpu":
                torch.accelerator.synchronize()
            result.cpu()
            return time.perf_counter() - started

        out["first_call_s"] = round(call(), 3)
        times = [call() for _ in range(args.steps)]
        out["step_ms_median"] = round(statistics.median(times) * 1000, 3)
        out["error"] = None
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
        out["traceback"] = traceback.format_exc()[-3000:]
    print(f"{MARKER} {json.dumps(out, sort_keys=True)}", flush=True)
    return 0 if out["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
