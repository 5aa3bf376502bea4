"""The SGLang launch flags `tpuserve engine launch` sets, with the source of each: one table.

`FLAGS` is the only place that names an SGLang command-line flag the launcher owns. The
launcher builds the command from it (`sglang_tpu.sglang_command`), the contract refuses extra
arguments that would override one of these flags (`OWNED_FLAGS`), and `docs/engine-launch.md`
prints it. `CPU_FLAGS` are the flags of the `cpu` development device (TPUSERVE_DEVICE=cpu): real
SGLang on this machine's CPU; they are defaults there, which extra arguments may override.

Sources:

- ``sglang-0.5.23``: the `sglang==0.5.23` wheel on PyPI (the version pinned in pyproject's
  `tpu` extra), `sglang/srt/arg_groups/fields/*.py` and
  `sglang/srt/disaggregation/kv_events.py` (`KVEventsConfig`).
- ``sglang-docs``: https://docs.sglang.io/references/multi_node_deployment/multi_node.html
  (`--tp`, `--dist-init-addr`, `--nnodes`, `--node-rank` for multi-node serving).
- ``unconfirmed``: SGLang-TorchTPU itself is not public (its recipes say "access to
  SGLang-TorchTPU will be available soon"); the upstream wheel has no TPU device. Flags marked
  so are our best reading and must be checked on a TPU VM with the SGLang-TorchTPU build.
"""

from __future__ import annotations

from dataclasses import dataclass

SGLANG_0_5_23 = "sglang-0.5.23"
SGLANG_DOCS = "sglang-docs"
UNCONFIRMED = "unconfirmed"


@dataclass(frozen=True, slots=True)
class Flag:
    """One SGLang flag the launcher owns."""

    name: str
    set_from: str  # the contract variable or derivation that gives its value
    source: str  # SGLANG_0_5_23 | SGLANG_DOCS | UNCONFIRMED
    note: str = ""
    aliases: tuple[str, ...] = ()


FLAGS: tuple[Flag, ...] = (
    Flag(
        "--model-path",
        "TPUSERVE_MODEL, resolved to a local directory by the fetch step",
        SGLANG_0_5_23,
        aliases=("--model",),
    ),
    Flag("--served-model-name", "TPUSERVE_SERVED_MODEL_NAME", SGLANG_0_5_23),
    Flag(
        "--device",
        "TPUSERVE_DEVICE: `tpu`, or `cpu` for the development device",
        UNCONFIRMED,
        "0.5.23's --device is a free string (cpu works); the TorchTPU build's value is "
        "assumed to be `tpu` (torch.device('tpu') in TorchTPU)",
    ),
    Flag(
        "--tp-size",
        "hosts x TorchTPU devices per host (the whole slice; tpu7x has 2 devices per chip); "
        "1 on cpu",
        SGLANG_0_5_23,
        "whether the TorchTPU build counts chips or TensorCores on tpu7x is unconfirmed",
        aliases=("--tp", "--tensor-parallel-size"),
    ),
    Flag("--nnodes", "TPUSERVE_HOSTS (multi-host only)", SGLANG_0_5_23),
    Flag("--node-rank", "TPUSERVE_HOST_INDEX (multi-host only)", SGLANG_0_5_23),
    Flag(
        "--dist-init-addr",
        "first worker hostname : TPUSERVE_DIST_INIT_PORT (multi-host only)",
        SGLANG_0_5_23,
        "SGLang also binds the next ports (port+1 .. port+6) on the leader",
        aliases=("--nccl-init-addr",),
    ),
    Flag("--host", "TPUSERVE_BIND_HOST", SGLANG_0_5_23),
    Flag("--port", "TPUSERVE_HTTP_PORT", SGLANG_0_5_23),
    Flag("--enable-metrics", "always set; /metrics on the HTTP port", SGLANG_0_5_23),
    Flag(
        "--enable-cache-report",
        "always set",
        SGLANG_0_5_23,
        "without it SGLang reports no cached tokens in OpenAI usage (clients, the router, "
        "the benchmark and the dashboards read them)",
    ),
    Flag(
        "--kv-events-config",
        'JSON {"publisher": "zmq", "endpoint": TPUSERVE_KV_EVENTS_PORT, "bind": true, '
        '"replay_endpoint": TPUSERVE_KV_REPLAY_PORT}',
        SGLANG_0_5_23,
        "bind: with a concrete host SGLang's publisher would connect instead of binding and "
        "nobody could subscribe (KVEventsConfig.bind)",
    ),
    Flag(
        "--quantization",
        "TPUSERVE_QUANTIZATION: fp8 -> fp8, mxfp4 -> mxfp4, nvfp4 -> modelopt_fp4; none -> unset",
        SGLANG_0_5_23,
        "which methods the TorchTPU build implements is unconfirmed",
    ),
    Flag(
        "--kv-cache-dtype",
        "TPUSERVE_KV_CACHE_DTYPE: fp8 -> fp8_e4m3; auto -> unset",
        SGLANG_0_5_23,
    ),
    Flag("--context-length", "TPUSERVE_CONTEXT_LENGTH", SGLANG_0_5_23),
    Flag(
        "--speculative-algorithm",
        "TPUSERVE_SPECULATIVE_ALGORITHM: EAGLE3 -> EAGLE3, MTP -> NEXTN",
        SGLANG_0_5_23,
    ),
    Flag(
        "--speculative-draft-model-path",
        "TPUSERVE_SPECULATIVE_DRAFT_MODEL, resolved to a local directory",
        SGLANG_0_5_23,
        aliases=("--speculative-draft-model",),
    ),
    Flag("--speculative-num-steps", "TPUSERVE_SPECULATIVE_NUM_STEPS", SGLANG_0_5_23),
    Flag(
        "--enable-torch-compile",
        "TPUSERVE_EXECUTION_MODE=compiled",
        SGLANG_0_5_23,
        "that the TorchTPU build compiles through torch.compile with this flag is unconfirmed",
    ),
    Flag(
        "--enable-hierarchical-cache",
        "TPUSERVE_HOST_KV_CACHE set",
        SGLANG_0_5_23,
        "the host-memory KV tier (docs/host-kv-tier.md); whether the TorchTPU build has it is "
        "unconfirmed",
        aliases=("--enable-hicache",),
    ),
    Flag("--hicache-write-policy", "TPUSERVE_HOST_KV_CACHE (its write policy)", SGLANG_0_5_23),
    Flag(
        "--hicache-io-backend",
        "direct, with the host tier",
        SGLANG_0_5_23,
        "SGLang's default, kernel, is CUDA/ROCm kernels; direct copies with torch (that the "
        "TorchTPU build accepts it is unconfirmed)",
    ),
    Flag("--hicache-size", "TPUSERVE_HOST_KV_SIZE_GB", SGLANG_0_5_23),
    Flag("--hicache-ratio", "TPUSERVE_HOST_KV_RATIO", SGLANG_0_5_23),
    Flag("--revision", "never set: the fetch step pins the revision", SGLANG_0_5_23),
)

# The cpu development device (TPUSERVE_DEVICE=cpu): what ran real SGLang 0.5.23 on a CPU-only
# machine (docs/engine-launch.md, "The cpu development device").
CPU_FLAGS: tuple[Flag, ...] = (
    Flag("--attention-backend", "torch_native", SGLANG_0_5_23, "the CPU attention path"),
    Flag("--sampling-backend", "pytorch", SGLANG_0_5_23),
    Flag("--grammar-backend", "none", SGLANG_0_5_23, "no grammar library needed"),
    Flag("--cuda-graph-backend-decode", "disabled", SGLANG_0_5_23),
    Flag("--cuda-graph-backend-prefill", "disabled", SGLANG_0_5_23),
    Flag("--sleep-on-idle", "", SGLANG_0_5_23, "an idle scheduler busy-polls a core without it"),
    Flag(
        "--max-total-tokens",
        "20000",
        SGLANG_0_5_23,
        "a small KV pool: by default SGLang sizes it from the machine's free memory",
    ),
)
CPU_ENV: dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "HF_HUB_OFFLINE": "1",  # the launcher fetched the weights; the server downloads nothing
    "TRANSFORMERS_OFFLINE": "1",
    "CUDA_VISIBLE_DEVICES": "",
}

OWNED_FLAGS: frozenset[str] = frozenset(
    name for flag in FLAGS for name in (flag.name, *flag.aliases)
)

# Flags whose values are secrets: refused in TPUSERVE_SGLANG_EXTRA_ARGS (command lines are logged).
SECRET_FLAGS: frozenset[str] = frozenset({"--api-key", "--admin-api-key"})

QUANTIZATION_METHODS = {"fp8": "fp8", "mxfp4": "mxfp4", "nvfp4": "modelopt_fp4"}
KV_CACHE_DTYPES = {"fp8": "fp8_e4m3"}
SPECULATIVE_ALGORITHMS = {"EAGLE3": "EAGLE3", "MTP": "NEXTN"}

DEFAULT_PYTHON = "python3"  # the image's interpreter, which has SGLang and TorchTPU
SGLANG_MODULE = ("-m", "sglang.launch_server")
# On a TPU: SGLang's launch_server with the TorchTPU adapter applied in the server's process,
# the same flags (`sglang_tpu.sglang_tpu_server`).
TPU_SGLANG_MODULE = ("-m", "sglang_tpu.sglang_tpu_server")


def owned_flag(arg: str) -> str | None:
    """The owned flag an extra argument would set (`--port=1` -> `--port`), or None."""
    name = arg.split("=", 1)[0]
    return name if name in OWNED_FLAGS else None


def cpu_flags() -> list[str]:
    """`CPU_FLAGS` as arguments (a flag with an empty value is a switch)."""
    return [arg for flag in CPU_FLAGS for arg in (flag.name, flag.set_from) if arg]
