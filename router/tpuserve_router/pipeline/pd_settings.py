"""PD mode's settings and its worker flags: what the router's configuration needs of PD mode
(`tpuserve_router.front.pd` is the mode itself), kept apart so the settings import no request
path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sglang_tpu import disaggregation
from tpuserve_router.engines.workers import WorkerSpec, normalize_worker_url

if TYPE_CHECKING:
    from sglang_tpu.perf_model import StepTimer

PD_POLICIES: Final = ("conditional", "always")
PREFILL: Final = "prefill"
DECODE: Final = "decode"


def parse_prefill_flag(text: str) -> WorkerSpec:
    """A ``--prefill`` value: ``URL`` or ``URL BOOTSTRAP_PORT`` (SGLang router's form)."""
    url, _, port = text.strip().partition(" ")
    normalize_worker_url(url)
    bootstrap: int | None = None
    if port.strip() and port.strip() != "none":
        try:
            bootstrap = int(port)
        except ValueError:
            bootstrap = -1
        if not 0 < bootstrap < 65536:
            raise ValueError(
                f"prefill {text!r}: bootstrap port {port.strip()!r} is not allowed; "
                "allowed: 1..65535 or none"
            )
    return WorkerSpec(url, role=PREFILL, bootstrap_port=bootstrap)


def pd_workers(prefill: Sequence[str], decode: Sequence[str]) -> list[WorkerSpec]:
    """The `WorkerSpec`s of ``--prefill`` and ``--decode`` values."""
    specs = [parse_prefill_flag(p) for p in prefill]
    for url in decode:
        normalize_worker_url(url)
        specs.append(WorkerSpec(url, role=DECODE))
    return specs


@dataclass(frozen=True, slots=True)
class PdSettings:
    policy: str
    threshold_tokens: int
    handoff_timeout_seconds: float
    timer: StepTimer | None = None
    """The performance model the threshold came from (None: ``--pd-threshold-tokens`` was
    given): it also times a short uncached suffix after a long cached prefix."""
    itl_budget_seconds: float = disaggregation.DEFAULT_ITL_BUDGET_SECONDS
