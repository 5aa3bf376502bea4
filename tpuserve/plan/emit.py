"""The chosen plan as a `TPUModelServer` manifest, checked by the operator's own validation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import yaml

from sglang_tpu import disaggregation as pd
from tpuserve.plan.planner import Candidate, Plan, PlanError
from tpuserve_operator import labels
from tpuserve_operator.api import ModelArchitecture
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.validation import validate

CRD_QUANTIZATION = {"bf16": "none", "none": "none", "fp8": "fp8"}
"""The planner's weight formats as `spec.model.quantization` spells them."""
FALLBACK_QUEUE_TARGET = 8.0
SGLANG_DISAGGREGATED = (
    f"--engine: 'sglang' cannot be emitted with --disaggregate: SGLang {pd.SGLANG_VERSION} has "
    "no transfer backend that moves KV between TPU slices (docs/pd.md); allowed: --engine "
    "simulated, or --disaggregate without --emit"
)
SGL_JAX_DISAGGREGATED = (
    "--engine: 'sglang-jax' cannot be emitted with --disaggregate: the operator does not "
    "launch SGLang-JAX's own prefill/decode pairs (docs/sglang-jax.md); allowed: --engine "
    "simulated, or --disaggregate without --emit"
)


def disaggregated_refusal(engine: str) -> str:
    """Why `engine` cannot be emitted with --disaggregate."""
    return SGL_JAX_DISAGGREGATED if engine == "sglang-jax" else SGLANG_DISAGGREGATED


def server_spec(
    result: Plan,
    choice: Candidate,
    model_source: str,
    engine: str,
    spot: bool,
    hf_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The spec: model, slice, engine and autoscaling bounds for the daily shape
    (``maxReplicas`` the peak's replicas, ``minReplicas`` the trough's, the ``tokensInFlight``
    target the KV tokens per chip one replica held at its planned capacity). With
    ``result.disaggregated``: a prefill and a decode role instead, each autoscaled from the
    trough's share of its peak count to it (prefill by its queue, decode as above). With
    ``hf_config`` (the keys `--hf-config` gave, `planner.hf_config_keys`): the model's
    ``architecture``, so the operator uses the profile the plan used."""
    inputs = result.inputs
    quantization = inputs.fleet.quantization
    if quantization not in CRD_QUANTIZATION:
        raise PlanError(
            f"--quantization: {quantization!r} cannot be emitted; allowed: "
            f"{', '.join(CRD_QUANTIZATION)}"
        )
    target = float(choice.at_capacity.get("tokens_in_flight_per_chip") or 0.0)
    spec: dict[str, Any] = {
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
    }
    if hf_config is not None:
        architecture = ModelArchitecture.model_validate(hf_config)
        spec["model"]["architecture"] = architecture.model_dump(by_alias=True, exclude_none=True)
    if inputs.host_kv_size_gb is not None:
        spec["kvCache"] = {"host": {"sizeGB": inputs.host_kv_size_gb}}
    split = result.disaggregated
    if split is None:
        spec["autoscaling"] = _bounds(choice.replicas, inputs.trough, target)
        return spec
    if engine in ("sglang", "sglang-jax"):
        raise PlanError(disaggregated_refusal(engine))
    spec["disaggregation"] = {
        "prefill": {"autoscaling": _bounds(split.prefill, inputs.trough, 0.0)},
        "decode": {"autoscaling": _bounds(split.decode, inputs.trough, target)},
    }
    return spec


def _bounds(peak: int, trough: float, tokens_per_chip: float) -> dict[str, Any]:
    """Autoscaling from the trough's share of ``peak`` (at least one) to ``peak``, on
    ``tokensInFlight`` when a target per chip is known, else on the queue."""
    bounds: dict[str, Any] = {"minReplicas": max(1, math.ceil(peak * trough)), "maxReplicas": peak}
    if tokens_per_chip >= 1:
        bounds.update(metric="tokensInFlight", target=round(tokens_per_chip))
    else:
        bounds.update(metric="queue", target=FALLBACK_QUEUE_TARGET)
    return bounds


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
