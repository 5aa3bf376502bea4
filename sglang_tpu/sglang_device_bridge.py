"""SGLang's scheduler on the host, its model on a TorchTPU device (issue 71, item 2).

SGLang 0.5.23 has no TPU platform: its `ModelRunner` runs with ``device="cpu"`` (every
`CustomOp` on its native torch path, ``attention_backend="torch_native"``), and its scheduler
keeps the request-to-token table and the KV slot allocator on the host. `DeviceBridge` moves
only the model's forward to the device:

- the model's weights go to the device after SGLang loaded them (`.to(device)`);
- the KV pool lives on the device: a `MHATokenToKVPool` of the scheduler's pool's size and
  layout, so the slots the scheduler's allocator and radix cache hand out index it directly
  (the scheduler's own host pool is never read);
- each forward copies the batch's tensors to the device, with the request-to-token rows of
  the batch's requests only (its `req_pool_indices` become 0..n-1 over those rows), runs the
  model there under a `TorchNativeAttnBackend` over the device pool, and returns the logits
  to the host, where SGLang's sampler runs.

With ``compile=True`` the model's forward runs through ``torch.compile(backend=...)`` with the
KV pool's writes kept eager and LogitsProcessor's integer cumsum on the host (the two fixes of
`sglang_tpu.sglang_torchtpu`). Every forward's wall time (to the logits on the host) is kept
in `steps` for the step-time figures. On the CPU (``device="cpu"``) the same path runs with
copies that change nothing: that is how the tests hold it to SGLang's own tokens.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MAX_STEPS_KEPT = 100_000


@dataclass
class StepRecord:
    mode: str  # "extend" or "decode"
    batch: int
    tokens: int
    seconds: float


@dataclass
class DeviceBridge:
    device: str
    compile: bool = False
    compile_backend: str = "tpu"
    steps: list[StepRecord] = field(default_factory=list)
    _attached: bool = False

    def attach(self, model_runner: Any) -> None:
        """Move `model_runner`'s model and KV pool to the device and route its forward."""
        import torch
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.model_executor.forward_context import ForwardContext

        from sglang_tpu.sglang_torchtpu import (
            keep_kv_pool_writes_eager,
            route_integer_cumsum_through_host,
        )

        if self._attached:
            raise RuntimeError("DeviceBridge.attach: already attached to a model runner")
        host_pool = model_runner.token_to_kv_pool
        if not isinstance(host_pool, MHATokenToKVPool):
            raise TypeError(
                f"token_to_kv_pool={type(host_pool).__name__}: the bridge supports "
                "MHATokenToKVPool (a dense-attention model) only"
            )
        self._req_to_token = model_runner.req_to_token_pool.req_to_token
        model = model_runner.model
        model.to(self.device)
        self.kv_pool = MHATokenToKVPool(
            size=host_pool.size,
            page_size=host_pool.page_size,
            dtype=host_pool.dtype,
            head_num=host_pool.head_num,
            head_dim=host_pool.head_dim,
            layer_num=host_pool.layer_num,
            device=self.device,
            enable_memory_saver=False,
            start_layer=host_pool.start_layer,
            end_layer=host_pool.end_layer,
            enable_alt_stream=False,
        )
        self._rows = SimpleNamespace(req_to_token=None)
        self.backend = TorchNativeAttnBackend(
            SimpleNamespace(
                device=self.device, req_to_token_pool=self._rows, token_to_kv_pool=self.kv_pool
            )
        )
        self.context = ForwardContext(attn_backend=self.backend)
        forward = model.forward  # bound to the model's class
        route_integer_cumsum_through_host()
        if self.compile:
            keep_kv_pool_writes_eager()
            forward = torch.compile(forward, backend=self.compile_backend)
        self._forward = forward
        model.forward = self.forward
        self._attached = True

    def _to_device(self, fb: Any) -> Any:
        import torch

        moved = copy.copy(fb)
        for f in dataclasses.fields(fb):
            value = getattr(fb, f.name)
            if isinstance(value, torch.Tensor) and not f.name.endswith("_cpu"):
                setattr(moved, f.name, value.to(self.device))
        rows = fb.req_pool_indices.to("cpu")
        longest = int(fb.seq_lens_cpu.max()) if fb.seq_lens_cpu is not None else None
        self._rows.req_to_token = self._req_to_token[rows, :longest].to(self.device)
        moved.req_pool_indices = torch.arange(len(rows), dtype=torch.int64).to(self.device)
        moved.req_to_token_pool = self._rows
        moved.token_to_kv_pool = self.kv_pool
        return moved

    def forward(self, input_ids: Any, positions: Any, forward_batch: Any, **kwargs: Any) -> Any:
        import torch
        from sglang.srt.model_executor.forward_context import forward_context

        started = time.perf_counter()
        fb = self._to_device(forward_batch)
        self.backend.init_forward_metadata(fb)
        with torch.no_grad(), forward_context(self.context, forward_batch=fb):
            out = self._forward(input_ids.to(self.device), positions.to(self.device), fb, **kwargs)
        for f in dataclasses.fields(out):
            value = getattr(out, f.name)
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                setattr(out, f.name, value.to("cpu"))
        if len(self.steps) < MAX_STEPS_KEPT:
            mode = "decode" if forward_batch.forward_mode.is_decode() else "extend"
            self.steps.append(
                StepRecord(
                    mode=mode,
                    batch=int(forward_batch.batch_size),
                    tokens=int(input_ids.shape[0]),
                    seconds=time.perf_counter() - started,
                )
            )
        return out


_BRIDGE: DeviceBridge | None = None


def install(bridge: DeviceBridge) -> DeviceBridge:
    """Attach `bridge` to the next `ModelRunner` SGLang initialises in this process, right
    after it allocated its memory pools (the model is loaded by then)."""
    global _BRIDGE
    from sglang.srt.model_executor.model_runner import ModelRunner

    _BRIDGE = bridge
    alloc = ModelRunner.alloc_memory_pool
    if getattr(alloc, "_tpuserve_bridge", False):
        return bridge

    def alloc_then_attach(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = alloc(self, *args, **kwargs)
        if _BRIDGE is not None and not _BRIDGE._attached:
            _BRIDGE.attach(self)
        return result

    alloc_then_attach._tpuserve_bridge = True  # type: ignore[attr-defined]
    ModelRunner.alloc_memory_pool = alloc_then_attach
    return bridge
