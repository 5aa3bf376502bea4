"""The TPUModelServerRole resource: an autoscaled role's count, for its
HorizontalPodAutoscaler."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tpuserve_operator.schema.base import Schema


class TPUModelServerRoleSpec(Schema):
    role: Literal["prefill", "decode"] = Field(
        description="role is the disaggregated server's role whose replica groups this counts."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description=(
            "replicas is the role's replica groups (whole slices), set through the scale "
            "subresource by the role's HorizontalPodAutoscaler (or kubectl scale); the operator "
            "renders that many groups of the role. The operator sets it once, when it creates "
            "this object, to the role's replicas within autoscaling.minReplicas..maxReplicas."
        ),
    )


class TPUModelServerRoleStatus(Schema):
    replicas: int = Field(
        default=0, ge=0, description="replicas: the role's replica groups that exist."
    )
    selector: str = Field(
        default="",
        description=(
            "selector of the role's leader pods, for the scale subresource (the HPA's Pods "
            "metrics average over them)."
        ),
    )
