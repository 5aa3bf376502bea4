"""The SGLang-JAX launch flags `tpuserve engine launch` sets, and the check of extra ones.

SGLang-JAX (`sgl_jax`, sgl-project/sglang-jax) is the second engine type
(`TPUSERVE_ENGINE=sglang-jax`, `spec.engine.type: sglang-jax`): SGLang's scheduler written in
JAX for TPUs. `FLAGS` names every flag of its server the launcher owns (the command is built
in `sglang_tpu.sgl_jax_command`); `DEFAULT_FLAGS` are defaults the launcher passes unless
spec.engine.args sets the same flag. Every other flag of spec.engine.args must be one of
SGLang-JAX's own (`sgl_jax_server_args.SERVER_FLAGS`, generated from its `ServerArgs` at the
commit the engine image pins): `extra_args_problems` refuses an unknown one by name, with the
nearest allowed names.

Source of every flag: ``python/sgl_jax/srt/server_args.py`` at `SOURCE_COMMIT`
(`sgl_jax_server_args`), and runs of that source on CPU and on a v5e
(docs/sglang-jax.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from sglang_tpu.sgl_jax_server_args import SERVER_FLAGS, SOURCE_COMMIT, ServerFlag
from sglang_tpu.sglang_flags import Flag

SGL_JAX = f"sglang-jax@{SOURCE_COMMIT[:8]}"
SGL_JAX_MODULE = ("-m", "sgl_jax.launch_server")
DEFAULT_PYTHON = "python3"  # the engine image's interpreter, which has sgl_jax and JAX

FLAGS: tuple[Flag, ...] = (
    Flag(
        "--model-path",
        "TPUSERVE_MODEL, resolved to a local directory by the fetch step",
        SGL_JAX,
        aliases=("--model",),
    ),
    Flag("--served-model-name", "TPUSERVE_SERVED_MODEL_NAME", SGL_JAX),
    Flag(
        "--device",
        "TPUSERVE_DEVICE: `tpu`, or `cpu` for the development device",
        SGL_JAX,
        "must equal JAX_PLATFORMS when that is set (ServerArgs asserts it); the launcher sets both",
    ),
    Flag(
        "--tp-size",
        "the slice's devices (hosts x devices per host: one per chip on v5e, v5p and v6e; "
        "two per tpu7x chip, as the catalog counts them); hosts on cpu (one CPU device per "
        "process)",
        SGL_JAX,
        "ServerArgs asserts tp_size divisible by nnodes; that JAX shows two devices per "
        "tpu7x chip is unconfirmed",
        aliases=("--tensor-parallel-size",),
    ),
    Flag("--nnodes", "TPUSERVE_HOSTS (multi-host only)", SGL_JAX),
    Flag("--node-rank", "TPUSERVE_HOST_INDEX (multi-host only)", SGL_JAX),
    Flag(
        "--dist-init-addr",
        "first worker hostname : TPUSERVE_DIST_INIT_PORT (multi-host only)",
        SGL_JAX,
        "the JAX distributed coordinator (jax.distributed.initialize(addr, nnodes, rank)); "
        "SGLang-JAX also binds port+5 and port+6 on the leader (its pub/sub between nodes)",
    ),
    Flag("--host", "TPUSERVE_BIND_HOST", SGL_JAX),
    Flag("--port", "TPUSERVE_HTTP_PORT", SGL_JAX),
    Flag(
        "--enable-metrics",
        "always set",
        SGL_JAX,
        "at this commit /metrics exposes no sglang:* series (docs/sglang-jax.md)",
    ),
    Flag(
        "--enable-cache-report",
        "always set",
        SGL_JAX,
        "cached tokens in OpenAI usage (usage.prompt_tokens_details.cached_tokens)",
    ),
    Flag(
        "--quantization",
        "TPUSERVE_QUANTIZATION: fp8 -> fp8; none -> unset (mxfp4 and nvfp4 are refused)",
        SGL_JAX,
    ),
    Flag("--kv-cache-dtype", "TPUSERVE_KV_CACHE_DTYPE: fp8 -> fp8_e4m3; auto -> unset", SGL_JAX),
    Flag("--context-length", "TPUSERVE_CONTEXT_LENGTH", SGL_JAX),
    Flag(
        "--speculative-algorithm",
        "TPUSERVE_SPECULATIVE_ALGORITHM: EAGLE3 -> EAGLE3, MTP -> NEXTN",
        SGL_JAX,
    ),
    Flag(
        "--speculative-draft-model-path",
        "TPUSERVE_SPECULATIVE_DRAFT_MODEL, resolved to a local directory",
        SGL_JAX,
        aliases=("--speculative-draft-model",),
    ),
    Flag("--speculative-num-steps", "TPUSERVE_SPECULATIVE_NUM_STEPS", SGL_JAX),
    Flag(
        "--hicache-storage",
        "`none` when TPUSERVE_HOST_KV_CACHE is set (a host pool behind the device cache)",
        SGL_JAX,
        "`file` (an L3 store) is refused by SGLang-JAX itself at this commit",
    ),
    Flag("--hicache-write-policy", "TPUSERVE_HOST_KV_CACHE (its write policy)", SGL_JAX),
    Flag(
        "--hicache-ratio",
        "TPUSERVE_HOST_KV_RATIO (SGLang-JAX has no size in GB: TPUSERVE_HOST_KV_SIZE_GB is "
        "refused)",
        SGL_JAX,
    ),
    Flag("--enable-lora", "TPUSERVE_LORA_ADAPTERS set", SGL_JAX),
    Flag("--lora-paths", "TPUSERVE_LORA_ADAPTERS as NAME=PATH", SGL_JAX),
    Flag("--revision", "never set: the fetch step pins the revision", SGL_JAX),
)

# Defaults the launcher passes unless spec.engine.args sets the flag (then the user's wins).
DEFAULT_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--page-size",
        "128",
        SGL_JAX,
        "SGLang-JAX's default is 1; on a v5e page 1 made the 1,024-token extend bucket take "
        "over 240 s to precompile, page 128 made the server ready in 47 s, and PD mode "
        "requires at least 128",
    ),
)
# The cpu development device: SGLang-JAX forces its native attention there (the Pallas
# kernels are TPU-only) and downloads nothing (the launcher fetched the weights).
CPU_FLAGS: tuple[Flag, ...] = (
    Flag("--attention-backend", "native", SGL_JAX, "pure JAX; `fa` (Pallas) is the TPU path"),
)
CPU_ENV: dict[str, str] = {
    "JAX_PLATFORMS": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

OWNED_FLAGS: frozenset[str] = frozenset(
    name for flag in FLAGS for name in (flag.name, *flag.aliases)
)
# Values that are secrets: refused on a command line (command lines are logged).
SECRET_FLAGS: frozenset[str] = frozenset({"--api-key", "--disaggregation-shared-secret"})

QUANTIZATION_METHODS = {"fp8": "fp8"}
KV_CACHE_DTYPES = {"fp8": "fp8_e4m3"}
SPECULATIVE_ALGORITHMS = {"EAGLE3": "EAGLE3", "MTP": "NEXTN"}
HOST_KV_STORAGE = "none"

SERVER_FLAG_BY_NAME: Mapping[str, ServerFlag] = {
    name: flag for flag in SERVER_FLAGS for name in flag.names
}
"""Every option string of SGLang-JAX's server (aliases included) -> its flag."""


def flag_name(arg: str) -> str:
    """`--a=1` and `a` -> `--a`."""
    return "--" + arg.split("=", 1)[0].lstrip("-")


def canonical(name: str) -> str:
    """The first option string of the flag `name` belongs to (`--tp-size` for its alias)."""
    flag = SERVER_FLAG_BY_NAME.get(name)
    return name if flag is None else flag.names[0]


def unknown_flag(name: str) -> str | None:
    """`name` (`--flag`) with the nearest flags SGLang-JAX has, or None when it has it."""
    if name in SERVER_FLAG_BY_NAME:
        return None
    close = difflib.get_close_matches(name, list(SERVER_FLAG_BY_NAME), n=3, cutoff=0.6)
    return f"{name} (did you mean {', '.join(close)}?)" if close else name


ALLOWED_TEXT = (
    f"the {len(SERVER_FLAGS)} flags of SGLang-JAX's ServerArgs at {SOURCE_COMMIT[:8]} "
    "(docs/sglang-jax.md lists them) less those the launcher sets"
)


def takes_list(name: str) -> bool:
    """Whether the flag `name` (`--flag`) takes several values (nargs + or *)."""
    flag = SERVER_FLAG_BY_NAME.get(name)
    return flag is not None and flag.kind == "list"


def flag_names(args: Sequence[str]) -> list[str]:
    """The flags of an argument list (`--a 1 --b --c=2` -> `--a`, `--b`, `--c`)."""
    return [flag_name(a) for a in args if a.startswith("--")]


def extra_args_problems(args: Sequence[str]) -> list[str]:
    """Why extra arguments may not go on SGLang-JAX's command line (empty when they may):
    unknown flags, flags the launcher owns, secrets."""
    names = flag_names(args)
    unknown = [u for n in dict.fromkeys(names) if (u := unknown_flag(n)) is not None]
    owned = sorted({n for n in names if canonical(n) in OWNED_FLAGS or n in OWNED_FLAGS})
    secret = sorted(set(names) & SECRET_FLAGS)
    reasons = []
    if unknown:
        reasons.append(
            f"SGLang-JAX's server has no flag {'; '.join(unknown)} (its flags: {ALLOWED_TEXT})"
        )
    if owned:
        reasons.append(f"sets {', '.join(owned)}, which the launcher sets from the contract")
    if secret:
        reasons.append(f"passes {', '.join(secret)}; secrets must not be on a command line")
    return reasons


def default_flags(extra_args: Sequence[str]) -> list[str]:
    """`DEFAULT_FLAGS` as arguments, less those the extra arguments set themselves."""
    given = {canonical(n) for n in flag_names(extra_args)}
    return [
        arg for f in DEFAULT_FLAGS if canonical(f.name) not in given for arg in (f.name, f.set_from)
    ]


def cpu_flags(extra_args: Sequence[str]) -> list[str]:
    """`CPU_FLAGS` as arguments, less those the extra arguments set themselves."""
    given = {canonical(n) for n in flag_names(extra_args)}
    return [
        arg for f in CPU_FLAGS if canonical(f.name) not in given for arg in (f.name, f.set_from)
    ]
