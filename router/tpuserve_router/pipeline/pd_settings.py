"""PD mode's settings and its worker flags: PD mode's part of the router's configuration
(`selection` and `pair_relay` are the mode itself), kept apart so the settings import no
request path. `pd_settings` makes them from a `RouterConfig`; `pd_problems` checks what the values
alone cannot (the worker flags, the performance model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sglang_tpu import disaggregation
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.workers import InvalidWorkerURL, WorkerSpec, normalize_worker_url

if TYPE_CHECKING:
    from sglang_tpu.perf_model import StepTimer

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


def pd_settings(config: RouterConfig) -> PdSettings | None:
    """PD mode's settings, or None without prefill and decode workers."""
    if not config.prefill and not config.decode and not config.pd_disaggregation:
        return None
    threshold = config.pd_threshold_tokens
    timer = None
    if threshold is None:
        timer = disaggregation.timer_for(config.pd_perf_model, "pd_perf_model")
        threshold = disaggregation.threshold_tokens(timer, config.pd_itl_budget_seconds)
    return PdSettings(
        config.pd_policy, threshold, config.pd_handoff_timeout_seconds, timer,
        config.pd_itl_budget_seconds,
    )  # fmt: skip


def pd_problems(config: RouterConfig) -> list[str]:
    """What is wrong with the ``--prefill``/``--decode`` values and ``pd_perf_model``."""
    problems: list[str] = []
    try:
        pd_workers(config.prefill, config.decode)
    except (InvalidWorkerURL, ValueError) as err:
        problems.append(str(err))
    try:
        disaggregation.timer_for(config.pd_perf_model, "pd_perf_model")
    except ValueError as err:
        problems.append(str(err))
    return problems
