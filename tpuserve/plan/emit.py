"""The chosen plan as a `TPUModelServer` manifest, checked by the operator's own validation."""

from __future__ import annotations

import math
from typing import Any

import yaml

from tpuserve.plan.planner import Candidate, Plan, PlanError
from tpuserve_operator import labels
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.validation import validate

CRD_QUANTIZATION = {"bf16": "none", "none": "none", "fp8": "fp8"}
"""The planner's weight formats as `spec.model.quantization` spells them."""
FALLBACK_QUEUE_TARGET = 8.0


def server_spec(
    result: Plan, choice: Candidate, model_source: str, engine: str, spot: bool
) -> dict[str, Any]:
    """The spec: model, slice, engine and autoscaling bounds for the daily shape
    (``maxReplicas`` the peak's replicas, ``minReplicas`` the trough's, the ``tokensInFlight``
    target the KV tokens per chip one replica held at its planned capacity)."""
    inputs = result.inputs
    quantization = inputs.fleet.quantization
    if quantization not in CRD_QUANTIZATION:
        raise PlanError(
            f"--quantization: {quantization!r} cannot be emitted; allowed: "
            f"{', '.join(CRD_QUANTIZATION)}"
        )
    peak = choice.replicas
    low = max(1, math.ceil(peak * inputs.trough))
    target = float(choice.at_capacity.get("tokens_in_flight_per_chip") or 0.0)
    autoscaling: dict[str, Any] = {"minReplicas": low, "maxReplicas": peak}
    if target >= 1:
        autoscaling.update(metric="tokensInFlight", target=round(target))
    else:
        autoscaling.update(metric="queue", target=FALLBACK_QUEUE_TARGET)
    return {
        "model": {
            "source": model_source,
            "quantization": CRD_QUANTIZATION[quantization],
            "contextLength": inputs.context_length,
        },
        "tpu": {
            "generation": choice.shape.generation.name,
            "topology": choice.shape.topology,
            "spot": spot,
        },
        "engine": {"type": engine},
        "autoscaling": autoscaling,
    }


def manifest(name: str, spec: dict[str, Any], header: list[str]) -> str:
    """The YAML `kubectl apply` takes; raises PlanError naming every problem the operator's
    admission validation finds (which would be a planner bug, or a bad --name/--model-source)."""
    try:
        validate(name, spec)
    except InvalidSpec as err:
        raise PlanError(f"the emitted TPUModelServer is not valid: {err}") from None
    body = {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    comments = "".join(f"# {line}\n" for line in header)
    return comments + yaml.safe_dump(body, sort_keys=False)
