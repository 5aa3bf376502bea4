"""What SGLang-TorchTPU must provide around SGLang 0.5.23's model code: the smallest adapter.

SGLang 0.5.23 has no TPU platform (its platforms load as plugins, `sglang.srt.platforms`), and
its `ModelRunner` needs `torch.distributed` groups (gloo opens TCP sockets, which the project's
TPU machine refuses) and a scheduler. The model classes themselves only need:

1. a published runtime context (`ServerArgs` with `device="cpu"`, so every `CustomOp` takes
   its native torch path, `attention_backend="torch_native"`) and placeholder process groups
   for tensor and pipeline parallelism at width 1 (`sglang.test.parallel_groups.publish`, plus
   a `pp_group`);
2. the model built on the CPU and moved with `.to(device)` (SGLang builds under
   `torch.device(device)`, which TorchTPU's device also accepts, but weights are loaded on the
   CPU first here: `load_weights` from a Transformers state dict);
3. the two pools on the device (`ReqToTokenPool`, `MHATokenToKVPool`, page size 1),
   `TorchNativeAttnBackend` over them, and a `ForwardContext`;
4. a `ForwardBatch` per step: EXTEND for the prefill, DECODE after it, with the KV slots of
   each request allocated by the caller (a scheduler's job: here request `r` owns slots
   `1 + r * max_context ...`).

`SGLangQwen3Runner` does exactly that and nothing more; `bench/tpu_real_model.py` drives it on
the CPU and on a TPU chip (docs/tpu-lane.md, *Real model code on the chip*). It imports SGLang
and torch lazily: the rest of the project never needs either.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

_PUBLISHED = False


class _StubMeta(type):
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{cls.__module__}.{cls.__name__}.{attr}")


def _stub_class(name: str) -> type:
    """A class standing for a missing package's class (subclassable, a pydantic field type)."""

    def schema(cls: Any, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def getattr_(self: Any, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_attr(name, attr)

    return _StubMeta(
        name.rsplit(".", 1)[-1],
        (),
        {
            "__init__": init,
            "__getattr__": getattr_,
            "__init_subclass__": classmethod(lambda cls, **kwargs: None),
            "__get_pydantic_core_schema__": classmethod(schema),
            "__module__": name.rsplit(".", 1)[0],
        },
    )


def _stub_attr(owner: str, attr: str) -> Any:
    if attr[:1].isupper():
        return _stub_class(f"{owner}.{attr}")
    return _Stub(f"{owner}.{attr}")


class _Stub:
    """Whatever a missing package's attribute is: callable, subscriptable, a decorator."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_attr(self._name, attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Stub(f"{self._name}()")

    def __getitem__(self, key: Any) -> Any:
        return _Stub(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __repr__(self) -> str:
        return f"<missing {self._name}>"


def install_missing_module_stubs(names: set[str]) -> list[str]:
    """Stand in for packages SGLang imports at load time but never runs on this path.

    For each top-level name in `names` that does not import, an empty package whose
    attributes are `_Stub`s: SGLang's serving stack (HTTP, tokenizer front ends, grammar
    back ends, Triton, CUDA helpers) imports them at module load. Returns the names stubbed.
    """
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import sys
    import types

    stubbed: list[str] = []
    for name in sorted(names):
        if name in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            stubbed.append(name)
    if not stubbed:
        return []
    tops = set(stubbed)
    if "triton" in tops:
        # torch probes for Triton once and caches the answer: ask it before the stand-in
        # exists, so torch keeps treating Triton as absent.
        import torch._inductor.compile_fx
        import torch.utils._triton as torch_triton
        import torch.utils.flop_counter  # noqa: F401

        torch_triton.has_triton_package()
        torch_triton.has_triton()

    class _Module(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__") and attr.endswith("__"):
                raise AttributeError(attr)
            value = _stub_attr(self.__name__, attr)
            setattr(self, attr, value)
            return value

    class _Loader(importlib.abc.Loader):
        def create_module(self, spec: Any) -> Any:
            module = _Module(spec.name)
            module.__path__ = []
            module.__version__ = "0.0.0"  # type: ignore[attr-defined]
            return module

        def exec_module(self, module: Any) -> None:
            return None

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname.split(".")[0] not in tops:
                return None
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)

    sys.meta_path.insert(0, _Finder())  # only for names nothing else found
    if "uvloop" in tops:
        # SGLang's tokenizer manager installs uvloop's policy at import: asyncio's own here.
        import asyncio
        import importlib

        uvloop: Any = importlib.import_module("uvloop")  # the stand-in
        uvloop.EventLoopPolicy = asyncio.DefaultEventLoopPolicy
        uvloop.new_event_loop = asyncio.new_event_loop
        uvloop.install = lambda: None
    if "triton" in tops:
        # SGLang asks Triton's active driver for the device and falls back to the CPU when
        # that raises (`sglang.kernels.ops.attention.fla.utils`); a stand-in must raise too.
        import importlib

        runtime: Any = importlib.import_module("triton.runtime")  # the stand-in

        class _NoDriver:
            def __getattr__(self, attr: str) -> Any:
                raise RuntimeError("Triton is a stand-in here: no active driver")

        runtime.driver = SimpleNamespace(active=_NoDriver())
    return stubbed


def tolerate_missing_processor_backends() -> list[str]:
    """Let SGLang's config package load where Transformers gates its image processors.

    `sglang.srt.configs` registers multimodal processors with Transformers' `AutoImageProcessor`
    / `AutoProcessor` when it is imported (every model imports it, through `ForwardBatch`). A
    Transformers without torchvision (5.17 on the project's TPU machine) makes those classes
    placeholders that raise ImportError, which ends the import. The registration only matters
    to multimodal models: the two helpers are loaded first and skip a refused registration.
    Returns the registrations skipped (filled in as SGLang's configs load).
    """
    import importlib.util
    import sys
    from pathlib import Path

    skipped: list[str] = []
    name = "sglang.srt.configs.utils"
    if name in sys.modules:
        return skipped
    import sglang.srt  # noqa: F401  (the parents, not sglang.srt.configs itself)

    spec = importlib.util.find_spec("sglang.srt")
    assert spec is not None
    assert spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "configs" / "utils.py"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    assert mod_spec is not None
    assert mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    mod_spec.loader.exec_module(module)

    def tolerant(fn: Any) -> Any:
        def wrapper(config: Any, processor: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(config, processor, *args, **kwargs)
            except ImportError as e:
                skipped.append(f"{fn.__name__}({config.__name__}): {str(e).strip()[:120]}")
                return None

        return wrapper

    for helper in ("register_image_processor", "register_processor"):
        setattr(module, helper, tolerant(getattr(module, helper)))
    return skipped


class _HostIntegerCumsum:
    """`torch` as SGLang's LogitsProcessor sees it, except that integer cumsums of device
    tensors run on the host (one small round trip per prefill). The round trip is kept out
    of `torch.compile`'s graphs (`torch.compiler.disable`: a graph break there), as a compiled
    step cannot copy a traced tensor to the host (TorchTPU: "cannot Materialize() a
    placeholder tensor", v5e call 4, docs/tpu-lane.md)."""

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module

        def host_cumsum(x: Any, dim: int, **kwargs: Any) -> Any:
            return torch_module.cumsum(x.cpu(), dim, **kwargs).to(x.device)

        self._host_cumsum = torch_module.compiler.disable(host_cumsum)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def cumsum(self, x: Any, dim: int, **kwargs: Any) -> Any:
        if x.device.type == "cpu" or x.is_floating_point() or x.is_complex():
            return self._torch.cumsum(x, dim, **kwargs)
        return self._host_cumsum(x, dim, **kwargs)


def route_integer_cumsum_through_host() -> None:
    """Work around the TPU compiler abort on `torch.cumsum` of a 1-D integer tensor.

    On the project's v5e (libtpu 0.0.42.1 behind the 0.0.50 shim, TorchTPU 0.2.0) that op
    aborts the process (`lowering_util.cc:3710 ... Unsupported conversion from vmreg/vreg to
    U64`, `windowing_util.cc:317 ... window_bounds.size() == rank`); SGLang's LogitsProcessor
    uses it for each prefill's last-token index. This makes that module's `torch.cumsum` run
    integer device inputs on the host (run on a v5e chip in call 4: docs/tpu-lane.md).
    """
    import sglang.srt.layers.logits_processor as logits_processor
    import torch

    if not isinstance(logits_processor.torch, _HostIntegerCumsum):
        logits_processor.torch = _HostIntegerCumsum(torch)


def keep_kv_pool_writes_eager() -> None:
    """Run SGLang's KV pool writes (`MHATokenToKVPool.set_kv_buffer`) outside a compiled graph.

    With the write inside ``torch.compile(backend="tpu")``'s graphs (TorchTPU 0.2.0, torch
    2.13 on the v5e), the first layer's keys and values land in the pool but the last layer's
    read back as NaN and the step's logits are not finite, so every greedy token is 0; with the
    write behind ``torch.compiler.disable`` (a graph break at each layer's write) the compiled
    prefill's and decode step's logits are the eager ones to 1e-5 (device call 7,
    docs/tpu-lane.md). Idempotent."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    write = MHATokenToKVPool.set_kv_buffer
    if not getattr(write, "_tpuserve_eager", False):
        eager = torch.compiler.disable(write)
        eager._tpuserve_eager = True
        MHATokenToKVPool.set_kv_buffer = eager


def publish_runtime_context() -> None:
    """Publish SGLang's runtime context for one process at width 1, without torch.distributed."""
    global _PUBLISHED
    if _PUBLISHED:
        return
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs
    from sglang.test.parallel_groups import publish

    publish(
        ServerArgs(
            model_path="dummy",
            device="cpu",
            attention_backend="torch_native",
            sampling_backend="pytorch",
        ),
        role="test",
    )
    get_parallel().override_permanently(
        pp_group=SimpleNamespace(
            rank_in_group=0,
            world_size=1,
            is_first_rank=True,
            is_last_rank=True,
            rank=0,
            ranks=[0],
            device_group=None,
            cpu_group=None,
        )
    )
    _PUBLISHED = True


class SGLangQwen3Runner:
    """SGLang's `Qwen3ForCausalLM` with a paged KV cache and torch-native attention on `device`.

    `hf_model` is a Transformers `Qwen3ForCausalLM` whose weights are loaded through SGLang's
    own `load_weights` (so both implementations hold the same numbers). `batch` requests of
    one prompt length each; `max_context` tokens per request.
    """

    def __init__(
        self,
        config_kwargs: dict[str, Any],
        hf_model: Any,
        *,
        device: str,
        dtype: Any,
        max_context: int,
        batch: int,
    ) -> None:
        import torch
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.model_executor.forward_context import ForwardContext
        from transformers import Qwen3Config

        publish_runtime_context()
        from sglang.srt.models.qwen3 import Qwen3ForCausalLM

        cfg = Qwen3Config(**config_kwargs)
        self.device = device
        self.batch = batch
        self.max_context = max_context
        model = Qwen3ForCausalLM(cfg)
        state = hf_model.state_dict()
        model.load_weights((k, v.to(torch.float32)) for k, v in state.items())
        self.model = model.to(dtype).to(device).eval()
        self.req_pool = ReqToTokenPool(
            size=batch, max_context_len=max_context, device=device, enable_memory_saver=False
        )
        self.kv_pool = MHATokenToKVPool(
            size=batch * max_context + 1,
            page_size=1,
            dtype=dtype,
            head_num=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            layer_num=cfg.num_hidden_layers,
            device=device,
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        runner = SimpleNamespace(
            device=device, req_to_token_pool=self.req_pool, token_to_kv_pool=self.kv_pool
        )
        self.backend = TorchNativeAttnBackend(runner)
        self.ctx = ForwardContext(attn_backend=self.backend)
        # Request r (pool row r + 1; row 0 is SGLang's padding row) owns KV slots
        # 1 + r * max_context ... (r + 1) * max_context.
        self.req_rows = torch.arange(1, batch + 1, dtype=torch.int64)
        slots = 1 + torch.arange(batch * max_context, dtype=torch.int32).view(batch, max_context)
        self.req_pool.req_to_token[1 : batch + 1] = slots.to(device)
        self._slots = slots.to(torch.int64)
        self.seq_len = 0
        self._forward = self._plain_forward

    def compile(self, *, kv_writes_in_graph: bool = False) -> None:
        """Compile the forward with TorchTPU's backend, the KV pool's writes kept eager
        (`keep_kv_pool_writes_eager`) unless ``kv_writes_in_graph`` (wrong tokens on the v5e)."""
        import torch

        if not kv_writes_in_graph:
            keep_kv_pool_writes_eager()
        self._forward = torch.compile(self._plain_forward, backend="tpu")

    def _plain_forward(self, input_ids: Any, positions: Any, fb: Any) -> Any:
        return self.model(input_ids, positions, fb).next_token_logits

    def _batch(
        self, mode: Any, input_ids: Any, positions: Any, out_loc: Any, lens: Any, **kw: Any
    ) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

        dev = self.device
        return ForwardBatch(
            forward_mode=mode,
            batch_size=self.batch,
            input_ids=input_ids,
            req_pool_indices=self.req_rows.to(dev),
            seq_lens=lens.to(dev),
            out_cache_loc=out_loc.to(dev),
            seq_lens_sum=int(lens.sum()),
            seq_lens_cpu=lens,
            positions=positions,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            **kw,
        )

    def _run(self, fb: Any) -> Any:
        from sglang.srt.model_executor.forward_context import forward_context

        self.backend.init_forward_metadata(fb)
        with forward_context(self.ctx, forward_batch=fb):
            return self._forward(fb.input_ids, fb.positions, fb)

    def prefill(self, ids: Any) -> Any:
        """`ids`: (batch, L) on the device. Returns the last position's logits per request."""
        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        b, n = ids.shape
        self.seq_len = n
        dev = self.device
        lens = torch.full((b,), n, dtype=torch.int64)
        zeros = torch.zeros(b, dtype=torch.int64)
        fb = self._batch(
            ForwardMode.EXTEND,
            ids.reshape(-1),
            torch.arange(n, dtype=torch.int64).repeat(b).to(dev),
            self._slots[:, :n].reshape(-1),
            lens,
            extend_num_tokens=b * n,
            extend_seq_lens=lens.to(dev),
            extend_prefix_lens=zeros.to(dev),
            extend_start_loc=(torch.arange(b, dtype=torch.int64) * n).to(dev),
            extend_seq_lens_cpu=lens.tolist(),
            extend_prefix_lens_cpu=zeros.tolist(),
            extend_logprob_start_lens_cpu=lens.tolist(),
        )
        with torch.no_grad():
            return self._run(fb)

    def decode(self, next_ids: Any) -> Any:
        """`next_ids`: (batch,) on the device, the tokens at position `seq_len`."""
        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        pos = self.seq_len
        self.seq_len += 1
        b = self.batch
        lens = torch.full((b,), pos + 1, dtype=torch.int64)
        fb = self._batch(
            ForwardMode.DECODE,
            next_ids.reshape(-1),
            torch.full((b,), pos, dtype=torch.int64).to(self.device),
            self._slots[:, pos],
            lens,
        )
        with torch.no_grad():
            return self._run(fb)
