"""SGLang's HTTP server with the TorchTPU adapter applied: the engine image's TPU entry.

    python -m sglang_tpu.sglang_tpu_server [SGLang's launch_server flags]

`tpuserve engine launch` runs this instead of ``python -m sglang.launch_server`` on a TPU
(`sglang_tpu.sglang_flags.TPU_SGLANG_MODULE`); the flags are SGLang's own, unchanged. Before
SGLang's server starts, in the server's own process, `apply_adapter` installs what
`sglang_tpu.sglang_torchtpu` found SGLang 0.5.23 needs on TorchTPU (issue 71):

1. stand-ins for the packages SGLang imports at load and never calls on this path
   (`STUB_PACKAGES`; only those that do not import are stood in for);
2. Transformers' image-processor registrations that a build without torchvision refuses are
   skipped (`tolerate_missing_processor_backends`);
3. LogitsProcessor's integer cumsum on the host (the TPU compiler aborts on it);
4. the KV pool's writes kept out of compiled graphs (`keep_kv_pool_writes_eager`: with them
   in the graph torch-tpu 0.2.x gave token 0 everywhere). The engine image declares
   ``TPUSERVE_SGLANG_KV_WRITES=eager`` (pre-flight's *compiled tokens* check) because this
   entry applies it: `tests/unit/sglang_tpu/test_sglang_tpu_server.py` ties the two.

SGLang's engine then runs in one process (`sglang_tpu.sglang_one_process`: scheduler and
detokenizer in threads, `torch.distributed` on the in-process fake backend), so the patches
above are the scheduler's too and no TCP socket is needed for SGLang's own plumbing. With
``--device tpu`` SGLang (which has no TPU platform) runs with ``device="cpu"`` and torch-native
attention, and `sglang_tpu.sglang_device_bridge` moves the model's forward and KV pool to
TorchTPU's device (compiled when ``--enable-torch-compile`` is given). With
``TPUSERVE_SGLANG_UDS=/path`` the HTTP API listens on that unix socket instead of
``--host``/``--port`` (the TPU machine refuses TCP, loopback included).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

UDS_ENV = "TPUSERVE_SGLANG_UDS"
ADAPTER_BANNER = (
    "TorchTPU adapter applied: KV pool writes {kv_writes}; host cumsum; stood in for: {stubbed}"
)
TPU_DEVICE = "tpu"

# SGLang 0.5.23 imports these at load; on this path they are never called, or only as no-ops
# (the chip's run of bench/sglang_engine_chip.py stood in for them; docs/tpu-lane.md). A
# package that imports is used as it is: only missing ones get a stand-in.
STUB_PACKAGES: frozenset[str] = frozenset({
    "IPython", "compressed_tensors", "cuda", "distro", "gguf", "mistral_common",
    "opentelemetry", "pycountry", "pynvml", "soundfile", "torch_memory_saver", "torchvision",
    "tvm_ffi", "triton", "xgrammar", "soxr", "llguidance", "interegular", "blobfile",
    "anthropic", "timm", "kernels", "numba", "decord", "av", "librosa", "nvidia",
    "smg_grpc_servicer", "grpc", "grpc_health", "grpc_reflection", "outlines",
    "pydantic_extra_types", "easydict",
})  # fmt: skip


@dataclass
class Applied:
    """What `apply_adapter` did in this process."""

    stubbed: list[str] = field(default_factory=list)
    skipped_registrations: list[str] = field(default_factory=list)
    host_cumsum: bool = False
    kv_writes: str = "graph"  # tpu_stack.KV_WRITES_VALUES


def apply_adapter() -> Applied:
    """Apply the TorchTPU adapter to SGLang in this process (before SGLang's server starts)."""
    from sglang_tpu import sglang_torchtpu as adapter

    applied = Applied()
    applied.stubbed = adapter.install_missing_module_stubs(set(STUB_PACKAGES))
    applied.skipped_registrations = adapter.tolerate_missing_processor_backends()
    adapter.route_integer_cumsum_through_host()
    applied.host_cumsum = True
    adapter.keep_kv_pool_writes_eager()
    applied.kv_writes = "eager"
    return applied


def kv_writes_in_effect() -> str:
    """Where SGLang's KV pool writes run in this process: "eager" when they are kept out of
    compiled graphs, else "graph" (the values of `tpu_stack.KV_WRITES_ENV`)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    eager = getattr(MHATokenToKVPool.set_kv_buffer, "_tpuserve_eager", False)
    return "eager" if eager else "graph"


def check_declaration(environ: Mapping[str, str]) -> None:
    """Refuse to serve when the image declares the KV pool's writes eager
    (`tpu_stack.KV_WRITES_ENV`, which pre-flight trusts) and they are not, in this process."""
    from sglang_tpu.tpu_stack import KV_WRITES_ENV

    declared = environ.get(KV_WRITES_ENV)
    if declared == "eager" and kv_writes_in_effect() != "eager":
        raise SystemExit(
            f"{KV_WRITES_ENV}=eager, but SGLang's KV pool writes are in the compiled graph "
            "in this process: the declaration is false; allowed: unset or graph"
        )


def _on_torchtpu(server_args: Any) -> Any:
    """SGLang's arguments for the host side of the bridge, and the bridge to TorchTPU."""
    import importlib

    from sglang_tpu import sglang_device_bridge

    # TorchTPU registers the `tpu` device when imported; its eager mode comes from the
    # TORCH_TPU_* variables the launcher sets (launch.EAGER_MODE_ENV).
    importlib.import_module("torch_tpu")
    compiled = bool(server_args.enable_torch_compile)
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # every CustomOp on its native torch path
    server_args.device = "cpu"
    server_args.attention_backend = "torch_native"
    server_args.sampling_backend = "pytorch"
    server_args.enable_torch_compile = False  # the bridge compiles the forward itself
    server_args.disable_cuda_graph = True
    return sglang_device_bridge.install(
        sglang_device_bridge.DeviceBridge(device=TPU_DEVICE, compile=compiled)
    )


def _serve_on_unix_socket(path: str, server_args: Any) -> None:
    """Make SGLang's uvicorn server listen on the unix socket `path`, not host:port."""
    import importlib

    from sglang.srt.entrypoints import http_server

    uvicorn: Any = importlib.import_module("uvicorn")  # only in SGLang's environment

    def config(app: Any, **kwargs: Any) -> Any:
        return uvicorn.Config(app, **kwargs, uds=path)

    http_server.uvicorn = _UvicornOnSocket(uvicorn, config)
    # The warm-up request and the post-warm-up `/freeze_gc` go to host:port over TCP: skip
    # the first; the second becomes `gc.freeze()` here, where the scheduler and detokenizer
    # are threads of this process.
    server_args.skip_server_warmup = True
    http_server._freeze_gc_after_server_warmup = lambda server_args: gc.freeze()


class _UvicornOnSocket:
    """`uvicorn` as SGLang's HTTP server module sees it, with `Config` bound to a socket."""

    def __init__(self, uvicorn: Any, config: Any) -> None:
        self._uvicorn = uvicorn
        self.Config = config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._uvicorn, name)


def main(argv: Sequence[str] | None = None) -> None:
    """Apply the adapter, then run SGLang's launch_server with `argv` in one process."""
    args = list(sys.argv[1:] if argv is None else argv)
    applied = apply_adapter()
    check_declaration(os.environ)
    # printed: SGLang configures logging later, and the pod's log should say it.
    print(ADAPTER_BANNER.format(kv_writes=applied.kv_writes, stubbed=", ".join(applied.stubbed)
                                or "nothing"), file=sys.stderr, flush=True)  # fmt: skip
    from sglang.launch_server import run_server
    from sglang.srt.entrypoints import http_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from sglang_tpu import sglang_one_process

    load_plugins()
    server_args = prepare_server_args(args)
    for flag, value in (("--tp-size", server_args.tp_size), ("--nnodes", server_args.nnodes)):
        if value != 1:
            raise SystemExit(
                f"{flag}={value}: the TorchTPU adapter's one-process engine runs at world "
                "size 1 only (one chip, one host); allowed: 1"
            )
    if server_args.device == TPU_DEVICE:
        _on_torchtpu(server_args)
    uds = os.environ.get(UDS_ENV)
    if uds:
        _serve_on_unix_socket(uds, server_args)
    sglang_one_process.use_fake_process_groups()
    if server_args.nccl_port is None:
        server_args.nccl_port = sglang_one_process.FIXED_NCCL_PORT
    http_server.Engine = sglang_one_process.engine_class()
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
