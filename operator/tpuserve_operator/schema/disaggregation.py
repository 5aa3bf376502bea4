"""`spec.disaggregation`: the prefill and decode roles of a disaggregated server."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sglang_tpu import disaggregation
from tpuserve_operator.schema.autoscaling import AutoscalingSpec
from tpuserve_operator.schema.base import ENGINE_ARGS_SCHEMA, Schema, section
from tpuserve_operator.schema.tpu import TPUSpec


class PdRoleSpec(Schema):
    tpu: TPUSpec | None = Field(
        default=None,
        description=(
            "tpu is the slice of one replica of this role, looked up in the topology catalog "
            "as spec.tpu is. Default: spec.tpu. The larger role's tensor parallelism (chips) "
            "must be a multiple of the smaller's: SGLang maps KV ranks by integer division."
        ),
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "replicas is the number of replica groups (whole slices) of this role; with "
            "autoscaling, the count it starts from. Default: 1."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "image of this role's engine container. Default: spec.engine.image. Both roles "
            "must run the same image: KV layouts of different engine versions cannot pair."
        ),
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra=ENGINE_ARGS_SCHEMA,
        description=(
            "args are extra SGLang flags for this role's engines, over spec.engine.args (same "
            "form). The disaggregation flags are the operator's; page-size and kv-cache-dtype "
            "must match between roles."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "autoscaling scales this role on its own: the operator creates a "
            "TPUModelServerRole <name>-<role> and a HorizontalPodAutoscaler <name>-<role> that "
            "scales it through its scale subresource (kubectl scale works on it too); the "
            "role's replica groups follow its spec.replicas, and replicas here only seeds it "
            "(within minReplicas..maxReplicas). metric: queue or ttft for prefill (ttft: the "
            "prefill engines' own p90 time to first token), queue or tokensInFlight for decode; "
            "minReplicas at least 1 (no scale to zero with roles). Removing it deletes the "
            "TPUModelServerRole: replicas is the count again. Unset: replicas is the count."
        ),
    )


class DisaggregationSpec(Schema):
    transfer_backend: Literal["mooncake", "mori", "nixl", "ascend", "fake"] = Field(
        default="mooncake",
        description=(
            "transferBackend is SGLang's --disaggregation-transfer-backend: mooncake, mori, "
            "nixl, ascend or fake. SGLang 0.5.23 has none that moves KV between TPU slices "
            "(they are RDMA GPU/NPU backends; fake moves nothing), so with engine.type sglang "
            "every value sets Valid=False, reason UnsupportedTransferBackend; the simulated "
            "engine times the transfer over the data-centre network whatever the value. "
            "Default: mooncake."
        ),
    )
    bootstrap_port: int = Field(
        default=disaggregation.DEFAULT_BOOTSTRAP_PORT,
        ge=1024,
        le=65535,
        description=(
            "bootstrapPort is the prefill engines' bootstrap server port "
            "(--disaggregation-bootstrap-port), advertised on their pods as the "
            "sglang.ai/bootstrap-port annotation. Default: 8998."
        ),
    )
    policy: Literal["conditional", "always"] = Field(
        default="conditional",
        description=(
            "policy is the router's --pd-policy: conditional disaggregates prompts whose "
            "uncached tokens reach the performance model's threshold when colocated replicas "
            "exist (none here: every request is disaggregated), always every request. "
            "Default: conditional."
        ),
    )
    prefill: PdRoleSpec = section(
        PdRoleSpec, "prefill is the role that computes prompts and sends their KV."
    )
    decode: PdRoleSpec = section(
        PdRoleSpec, "decode is the role that receives the KV and generates the answers."
    )
