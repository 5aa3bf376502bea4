"""`spec.tpu`: the TPU slice of one replica (generation, topology, Spot, reservation)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from sglang_tpu.topology import SLICE_SHAPES, generation_names
from tpuserve_operator.schema.base import DNS_LABEL, Schema, rules

TOPOLOGY_PATTERN = r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}(x[1-9][0-9]{0,2})?$"
TOPOLOGY_2D = "^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$"
TOPOLOGY_3D = "^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$"


# Generations whose slices are 3-D tori (topology AxBxC); the others are 2-D (AxB).
THREE_DIMENSIONAL = tuple(
    g
    for g in generation_names()
    if all(len(s.dims) == 3 for s in SLICE_SHAPES if s.generation.name == g)
)
THREE_DIMENSIONAL_CEL = "[" + ", ".join(f"'{g}'" for g in THREE_DIMENSIONAL) + "]"


class TPUSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                f"!(self.generation in {THREE_DIMENSIONAL_CEL}) || "
                f"self.topology.matches('{TOPOLOGY_3D}')",
                "tpu.topology for v5p and tpu7x has three dimensions, for example 2x2x2",
            ),
            (
                f"self.generation in {THREE_DIMENSIONAL_CEL} || "
                f"self.topology.matches('{TOPOLOGY_2D}')",
                "tpu.topology for v5e and v6e has two dimensions, for example 4x4",
            ),
        )
    )

    generation: str = Field(
        max_length=16,
        json_schema_extra={"enum": list[Any](generation_names())},
        description=(
            "generation is the TPU generation: v5e, v5p, v6e (Trillium) or tpu7x (Ironwood). "
            "With topology it selects the node pool (cloud.google.com/gke-tpu-accelerator)."
        ),
    )
    topology: str = Field(
        max_length=11,
        pattern=TOPOLOGY_PATTERN,
        description=(
            "topology is the slice shape of one replica as GKE labels it "
            "(cloud.google.com/gke-tpu-topology). (generation, topology) is looked up in the "
            "topology catalog, which gives hosts and chips per host: v6e 4x4 is 4 hosts of 4 "
            "chips, v6e 2x4 is one 8-chip host, tpu7x 2x2x2 is 2 hosts of 4 chips. A pair not "
            "in the catalog sets Valid=False, reason UnsupportedTopology, listing valid ones."
        ),
    )
    spot: bool = Field(
        default=False,
        description=(
            "spot schedules onto Spot TPU node pools (node selector cloud.google.com/gke-spot). "
            "Spot VMs get 30 s notice before preemption, which caps the pods' drain then; "
            "engine pods pause 2 s in preStop (5 s on demand). Default: false."
        ),
    )
    reservation: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "reservation pins the pods to a specific Compute Engine reservation (node selector "
            "cloud.google.com/reservation-name). Default: none."
        ),
    )

    @field_validator("generation")
    @classmethod
    def _known_generation(cls, value: str) -> str:
        allowed = generation_names()
        if value not in allowed:
            raise ValueError(f"{value!r} is not allowed; allowed: {', '.join(allowed)}")
        return value
