"""`spec.kvCache`: the engines' KV cache beyond HBM (the host-memory tier)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from sglang_tpu import hicache
from tpuserve_operator.schema.base import Schema, rules


class HostKvCacheSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "!(has(self.sizeGB) && has(self.ratio))",
                "kvCache.host takes one of sizeGB and ratio, not both",
            )
        )
    )

    size_gb: int | None = Field(
        default=None,
        alias="sizeGB",
        ge=1,
        le=4096,
        description=(
            "sizeGB is the host pool of each engine rank in GB (10^9 bytes), SGLang's "
            "--hicache-size; a host runs one rank per TPU device, so a v5e 2x4 host holds 8 x "
            "sizeGB. It must fit the engine's memory (spec.engine.resources, default 90% of "
            "what GKE leaves to pods on the machine type) less what the engine itself needs and "
            "SGLang's 10 GiB reserve; a larger value is refused naming the largest allowed "
            "(docs/host-kv-tier.md lists it per machine type). Exclusive with ratio."
        ),
    )
    ratio: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description=(
            "ratio sizes the host pool as a multiple of the device (HBM) KV pool, SGLang's "
            "--hicache-ratio. Checked against the host's memory when the model's profile is "
            "known. Unset with sizeGB unset: SGLang's default, 2.0 lowered until the pools fit "
            "80% of the memory it finds free. Exclusive with sizeGB."
        ),
    )
    write_policy: hicache.WritePolicy = Field(
        default=hicache.DEFAULT_WRITE_POLICY,
        description=(
            "writePolicy is when a KV page gets its host copy, SGLang's --hicache-write-policy: "
            "write_through (as soon as it is cached), write_through_selective (on its second "
            "hit) or write_back (only when HBM evicts it). Default: write_through."
        ),
    )


class KvCacheSpec(Schema):
    host: HostKvCacheSpec | None = Field(
        default=None,
        description=(
            "host adds a host-memory tier below HBM (SGLang's hierarchical cache, "
            "--enable-hierarchical-cache): pages HBM evicts are kept in host memory and loaded "
            "back instead of computed again, and the router routes to an engine holding a "
            "prompt's prefix in either tier (docs/host-kv-tier.md). Unset: HBM only."
        ),
    )
