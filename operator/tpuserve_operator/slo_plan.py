"""A server sized from its SLO: spec.slo and spec.demand -> the slice and the replicas.

A ``TPUModelServer`` may state ``spec.slo`` (TTFT and ITL percentiles) and ``spec.demand``
(the peak request rate, mean prompt and output lengths) instead of a slice and replica
bounds. `resolve` runs the planner (`sglang_tpu.slo_sizing`: the calibrated performance
model, analytic, milliseconds a slice; the same as ``tpuserve plan --fit``) and returns the
spec as if the user had written its choice: ``tpu`` (unless the user gave one: their slice
wins, only the replicas are planned), and ``replicas`` (the peak's count) or, with
``autoscaling``, its ``minReplicas``/``maxReplicas`` (the trough's and the peak's; the
user's ``maxReplicas`` stays a cap, and a ``minReplicas: 0`` stays 0, scale to zero).
Everything after it (validation, rendering) sees an ordinary spec; the plan goes to
``status.plan``. It runs on every reconcile of the spec, so a changed spec is planned again
(``status.plan.observedGeneration``).

The candidate slices are the operator's ``--plan-slices`` (the node pools the cluster has),
by default every single-host slice of the catalog. The operator cannot run `tpuserve plan`'s
simulation: the fleet model imports the router's policies and the operator never imports
the router (docs/architecture.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from sglang_tpu import slo_sizing
from sglang_tpu.perf_model import ModelProfile
from sglang_tpu.topology import SLICE_SHAPES, CatalogError, SliceShape, lookup
from tpuserve_operator import model_profile
from tpuserve_operator.api import (
    ErrorBandStatus,
    OperatingPointStatus,
    TPUModelServerSpec,
    TPUSpec,
)
from tpuserve_operator.conditions import Reason
from tpuserve_operator.errors import Problem

DEFAULT_SLICES: tuple[SliceShape, ...] = tuple(s for s in SLICE_SHAPES if not s.multi_host)
"""The slices planned on without ``--plan-slices``: every single-host one of the catalog."""


def parse_slices(text: str, flag: str = "--plan-slices") -> tuple[SliceShape, ...]:
    """``GEN:TOPOLOGY,...`` (``v6e:2x4,v5e:2x4``) as catalog slices; ValueError naming the
    flag, the value and what is allowed."""
    out: list[SliceShape] = []
    for item in (x.strip() for x in text.split(",")):
        gen, sep, topo = item.partition(":")
        if not sep:
            raise ValueError(f"{flag}: {item!r} is not allowed; allowed: GENERATION:TOPOLOGY, "
                             "for example v6e:2x4")  # fmt: skip
        try:
            out.append(lookup(gen, topo, field_path=flag))
        except CatalogError as err:
            raise ValueError(str(err)) from None
    if not out:
        raise ValueError(f"{flag}: {text!r} is not allowed; allowed: one slice or more")
    return tuple(out)


@dataclass(frozen=True)
class SloPlan:
    """The planner's choice for a server, as status.plan reports it."""

    source: str
    """``Spec`` (the user's slice, replicas planned) or ``Planned`` (both planned)."""
    size: slo_sizing.SliceSize
    min_replicas: int
    max_replicas: int
    message: str

    def operating_point(self) -> OperatingPointStatus:
        p = self.size.point
        assert p is not None  # a plan is made of a slice that serves the demand
        return OperatingPointStatus(
            requests_per_second=round(p.requests_per_second, 4),
            concurrency=round(p.concurrency, 2),
            decode_batch=p.decode_batch,
            ttft_p50_seconds=round(p.ttft_p50, 4),
            ttft_p99_seconds=round(p.ttft_p99, 4),
            itl_seconds=round(p.itl, 5),
            tokens_per_second_per_chip=round(p.tokens_per_second_per_chip, 1),
        )

    @staticmethod
    def error_band() -> ErrorBandStatus:
        e, t = slo_sizing.PERF_MODEL_ERROR, slo_sizing.TTFT_P99_ERROR
        return ErrorBandStatus(median=e["median"], worst=e["worst"], figures=int(e["rows"]),
                               ttft_p99_low=t["low"], ttft_p99_high=t["high"])  # fmt: skip


CACHE_SIZE = 256
_cache: OrderedDict[tuple[object, ...], tuple[slo_sizing.SliceSize, ...]] = OrderedDict()


def _sized(
    shapes: tuple[SliceShape, ...],
    profile: ModelProfile,
    demand: slo_sizing.Demand,
    slo: slo_sizing.Slo,
    quantization: str,
    kv_cache_dtype: str,
    context_length: int,
) -> tuple[slo_sizing.SliceSize, ...]:
    """Memoised (the last `CACHE_SIZE` questions): every reconcile of an unchanged spec asks
    the same one."""
    key = (tuple(s.key for s in shapes), repr(profile), demand, slo, quantization,
           kv_cache_dtype, context_length)  # fmt: skip
    found = _cache.get(key)
    if found is not None:
        _cache.move_to_end(key)
        return found
    sized = tuple(
        slo_sizing.size(shapes, profile, demand, slo, quantization=quantization,
                        kv_cache_dtype=kv_cache_dtype, context_length=context_length)
    )  # fmt: skip
    _cache[key] = sized
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return sized


def resolve(
    spec: TPUModelServerSpec, slices: Sequence[SliceShape] = DEFAULT_SLICES
) -> tuple[TPUModelServerSpec, SloPlan | None, list[Problem]]:
    """The spec with the plan written in (or unchanged without spec.slo), the plan, and the
    problems that stop it (each naming the field, the value and what is allowed)."""
    given = cast("TPUSpec | None", spec.tpu)  # unset before resolving, with slo and demand
    if spec.slo is None or spec.demand is None:
        if spec.slo is not None:
            return spec, None, [Problem("spec.demand", "required with spec.slo")]
        if spec.demand is not None:
            return spec, None, [Problem("spec.slo", "required with spec.demand")]
        if given is None:
            why = "required unless spec.slo and spec.demand are set (the operator then plans it)"
            return spec, None, [Problem("spec.tpu", why)]
        return spec, None, []
    if spec.disaggregation is not None:
        return spec, None, [Problem("spec.slo", "not allowed with spec.disaggregation; allowed: "
                                    "a colocated server (each role sizes on its own)")]  # fmt: skip
    profile = model_profile.profile_of(spec)
    if profile is None:
        return spec, None, [Problem(
            "spec.slo",
            f"the performance model does not know {spec.model.source!r}; allowed: a source of "
            "a built-in profile, or spec.model.architecture (its config.json facts)",
            reason=Reason.UNKNOWN_MODEL,
        )]  # fmt: skip
    if given is not None:
        try:
            shapes: tuple[SliceShape, ...] = (lookup(given.generation, given.topology),)
        except CatalogError:
            return spec, None, []  # validation reports the slice
        source = "Spec"
    else:
        shapes, source = tuple(slices), "Planned"
    d, s = spec.demand, spec.slo
    demand = slo_sizing.Demand(d.requests_per_second, d.prompt_tokens, d.output_tokens,
                               d.prefix_reuse, d.trough)  # fmt: skip
    slo = slo_sizing.Slo(s.ttft_p99_seconds, s.itl_p99_seconds, s.ttft_p50_seconds,
                         s.itl_p50_seconds)  # fmt: skip
    context = spec.model.context_length or profile.context_length
    try:
        sizes = _sized(shapes, profile, demand, slo, spec.model.quantization,
                       spec.engine.kv_cache_dtype, context)  # fmt: skip
    except ValueError as err:  # a quantization the performance model does not cover
        return spec, None, [Problem("spec.model.quantization", str(err))]
    ranked = slo_sizing.rank(sizes)
    if not ranked:
        why = "; ".join(f"{x.shape.key}: {x.why_not}" for x in sizes)
        return spec, None, [Problem(
            "spec.slo",
            f"no slice serves {d.requests_per_second:g} req/s of {d.prompt_tokens}+"
            f"{d.output_tokens} tokens within TTFT p99 {s.ttft_p99_seconds:g} s and ITL p99 "
            f"{s.itl_p99_seconds:g} s ({why}); allowed: a looser slo, a smaller demand, or "
            "more slices (--plan-slices)",
            reason=Reason.SLO_NOT_MET,
        )]  # fmt: skip
    best = ranked[0]
    point = best.point
    assert point is not None
    update: dict[str, object] = {}
    if given is None:
        update["tpu"] = TPUSpec(generation=best.shape.generation.name, topology=best.shape.topology)
    low, high = best.min_replicas, best.replicas
    capped = ""
    if spec.autoscaling is None:
        update["replicas"] = high
    else:
        cap = spec.autoscaling.max_replicas
        if high > cap:
            capped = f"; capped at autoscaling.maxReplicas {cap}, below the peak's {high}"
            high = cap
        low = 0 if spec.autoscaling.min_replicas == 0 else min(low, high)
        update["autoscaling"] = spec.autoscaling.model_copy(
            update={"min_replicas": low, "max_replicas": high}
        )
    message = (
        f"{high} x {best.shape.key} for {d.requests_per_second:g} req/s at the peak "
        f"({low} at the trough{capped}): {point.requests_per_second:.2f} req/s per replica at "
        f"concurrency {point.concurrency:.0f}, TTFT p99 {point.ttft_p99:.2f} s, ITL "
        f"{point.itl * 1e3:.0f} ms (analytic; ranked by tokens per chip among "
        f"{len(ranked)} of {len(sizes)} slices)"
    )
    plan = SloPlan(source, best, low, high, message)
    return spec.model_copy(update=update), plan, []
