"""`spec.slo` and `spec.demand`: the targets and load the operator sizes a server for."""

from __future__ import annotations

from pydantic import Field

from tpuserve_operator.schema.base import Schema


class SloSpec(Schema):
    ttft_p99_seconds: float = Field(
        gt=0,
        le=3600,
        description=(
            "ttftP99Seconds is the 99th percentile of time to first token the server must meet "
            "at spec.demand, in seconds. Example: 2."
        ),
    )
    itl_p99_seconds: float = Field(
        gt=0,
        le=60,
        description=(
            "itlP99Seconds is the 99th percentile of inter-token latency (each request's mean "
            "time between output tokens), in seconds. Example: 0.1."
        ),
    )
    ttft_p50_seconds: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="ttftP50Seconds is a median time to first token to meet too. Default: none.",
    )
    itl_p50_seconds: float | None = Field(
        default=None,
        gt=0,
        le=60,
        description="itlP50Seconds is a median inter-token latency to meet too. Default: none.",
    )


class DemandSpec(Schema):
    requests_per_second: float = Field(
        gt=0,
        le=1_000_000,
        description=(
            "requestsPerSecond is the request rate at the daily peak the server must serve "
            "within spec.slo. Example: 20."
        ),
    )
    prompt_tokens: int = Field(
        ge=1, le=10_000_000, description="promptTokens is the mean prompt length, in tokens."
    )
    output_tokens: int = Field(
        ge=1, le=10_000_000, description="outputTokens is the mean output length, in tokens."
    )
    prefix_reuse: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description=(
            "prefixReuse is the share of each prompt found in the prefix cache (a shared "
            "system prompt, earlier turns of a conversation). Default: 0."
        ),
    )
    trough: float = Field(
        default=0.35,
        ge=0,
        le=1,
        description=(
            "trough is the daily low as a share of the peak: with spec.autoscaling the plan's "
            "minReplicas is the peak's replicas times it (at least 1). Default: 0.35."
        ),
    )
