"""`spec.kvCache.host`: the host-memory KV tier, checked against the host it runs on.

SGLang refuses to start when a rank's host pool does not fit what the container has left
less its 10 GiB reserve (`sglang_tpu.hicache`); the operator refuses it earlier, naming the
field and the largest value that fits. What a pod may use is the engine container's memory
limit (`engine_resources`: by default 90% of what GKE leaves to pods on the machine type;
`spec.engine.resources` may lower or raise it), less what the engine itself needs and SGLang's
reserve; `sizeGB` counts per rank and a host runs one rank per TPU device. The simulated
engine is held to the same TPU host (its catalog machine type), whatever its own pod gets.

- `sizeGB` is checked for every model; the admission policy (`build/admission.py`) checks it
  too, with the same message template, when `spec.engine.resources` leaves memory at its
  default (with an override, only the operator judges it).
- `ratio` is checked when the performance model knows the model (the device pool follows
  from its weights and the slice's HBM); only the operator judges it.

The requests and limits themselves are `engine_resources`' (requests = limits), which the
tier has to fit in: nothing is added for it.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Final

from sglang_tpu import hicache, perf_model
from sglang_tpu.topology import GIB, SliceShape
from tpuserve_operator import engine_resources, model_profile
from tpuserve_operator.api import TPUModelServerSpec
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import Problem

SIZE_FIELD: Final = "spec.kvCache.host.sizeGB"
RATIO_FIELD: Final = "spec.kvCache.host.ratio"

# The refusals' messages, as templates: `problems` fills them in Python and
# `build.admission` in CEL (word for word).
SIZE_MESSAGE: Final = "{value} GB per rank does not fit {host}; allowed: at most {largest}"
RATIO_MESSAGE: Final = (
    "{value} x the device pool ({pool} GiB per host) does not fit {host}; allowed: at most "
    "{largest}"
)


def describe(shape: SliceShape, memory_limit: float) -> str:
    """What one host of `shape` leaves to the tier, in words (the messages' `{host}`)."""
    return (
        f"one {shape.machine_type} host ({hicache.ranks_per_host(shape)} ranks; "
        f"{memory_limit / GIB:.1f} GiB engine memory less "
        f"{hicache.ENGINE_HOST_BYTES / GIB:.0f} GiB for the engine and SGLang's "
        f"{hicache.SGLANG_RESERVE_BYTES / GIB:.0f} GiB reserve)"
    )


def default_memory_limit(shape: SliceShape) -> float:
    """The engine container's memory limit when spec.engine.resources sets none."""
    return float(engine_resources.defaults(shape.machine)["memory"])


def memory_limit(spec: TPUModelServerSpec, shape: SliceShape) -> float:
    """The engine container's memory limit on one host of `shape` (see the module doc)."""
    if spec.engine.type not in ("sglang", "sglang-jax"):  # the twin: the default
        return default_memory_limit(shape)
    _, limits = engine_resources.engine_requirements(spec.engine.resources, shape.machine)
    amount = engine_resources.quantity(limits.get("memory"))
    return float(amount if amount is not None else Decimal(default_memory_limit(shape)))


def device_pool_bytes(
    spec: TPUModelServerSpec, shape: SliceShape, profile: perf_model.ModelProfile | None
) -> float | None:
    """The slice's HBM KV pool in bytes, when the performance model knows the model."""
    if profile is None:
        return None
    try:
        tokens = perf_model.kv_pool_tokens(
            shape, profile, spec.model.quantization, spec.engine.kv_cache_dtype
        )
    except ValueError:  # a quantization the performance model does not cover: no opinion
        return None
    return tokens * profile.kv_bytes_per_token(spec.engine.kv_cache_dtype)


INDEX_POLICIES: Final = (None, "precise", "cost")
"""Router policies that take `host_hit_weight` (a block-index policy's parameter); None: the
router's default, `precise`."""


def host_hit_weight(spec: TPUModelServerSpec, shape: SliceShape) -> float | None:
    """What the router's policy should weigh a host-tier block at for this server (its slice's
    and model's `StepTimer.host_hit_value`), None when it has no host tier or the performance
    model does not know the model (the router's default weight applies)."""
    if spec.kv_cache is None or spec.kv_cache.host is None:
        return None
    profile = model_profile.profile_of(spec)
    if profile is None:
        return None
    try:
        timer = perf_model.StepTimer(
            shape, profile, spec.model.quantization, spec.engine.kv_cache_dtype
        )
    except ValueError:  # a quantization the performance model does not cover
        return None
    return round(timer.host_hit_value(), 3)


def problems(
    spec: TPUModelServerSpec, shape: SliceShape, profile: perf_model.ModelProfile | None
) -> list[Problem]:
    """The tier's size against the host's memory (nothing when there is no tier); `profile`:
    the model's performance profile, None when unknown."""
    host = spec.kv_cache.host if spec.kv_cache is not None else None
    if host is None:
        return []
    limit = memory_limit(spec, shape)
    budget = hicache.pool_budget_bytes(limit)
    if host.size_gb is not None:
        largest = hicache.max_size_gb(shape, limit)
        if host.size_gb > largest:
            message = SIZE_MESSAGE.format(
                value=host.size_gb, host=describe(shape, limit), largest=largest
            )
            return [Problem(SIZE_FIELD, message, reason=Reason.HOST_KV_DOES_NOT_FIT)]
        return []
    if host.ratio is None:
        return []  # SGLang sizes the pool to fit
    pool = device_pool_bytes(spec, shape, profile)
    if not pool:
        return []
    needed = hicache.host_bytes_per_host(
        shape, size_gb=None, ratio=host.ratio, device_pool_bytes=pool
    )
    if needed <= budget:
        return []
    largest_ratio = math.floor(budget * shape.hosts / pool * 100) / 100
    message = RATIO_MESSAGE.format(
        value=host.ratio,
        pool=f"{pool / shape.hosts / GIB:.1f}",
        host=describe(shape, limit),
        largest=largest_ratio,
    )
    return [Problem(RATIO_FIELD, message, reason=Reason.HOST_KV_DOES_NOT_FIT)]
