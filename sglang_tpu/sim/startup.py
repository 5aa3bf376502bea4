"""The engine twin's cold start: pull, weights and compile before it listens, then warmup.

As a real SGLang 0.5.23 server: its HTTP port opens only once the model is loaded and
compiled (the scheduler processes come up first), then `/health` and `/health_generate`
answer 503 while the warmup request runs (`ServerStatus.Starting` in its http_server) and
200 once it is done. Each phase sleeps its modelled seconds (`sglang_tpu.cold_start`) times
``time_scale`` (0: instant, the default, so a twin starts at once unless asked). A compile
that finds no entry for its key in the compile-cache directory writes one, so the next
start with the same key is warm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_tpu.cold_start import (
    TPU_FIGURES,
    CacheResult,
    ColdStartFigures,
    ColdStartReport,
    sim_cache_holds,
    write_sim_cache_entry,
)

log = logging.getLogger(__name__)

BEFORE_LISTENING = ("pull", "weights", "compile")
AFTER_LISTENING = ("warmup",)


@dataclass(frozen=True, slots=True)
class StartupSettings:
    """How the twin's cold start is modelled and where its compile cache is."""

    figures: ColdStartFigures = TPU_FIGURES
    time_scale: float = 0.0
    compile_cache_dir: str | None = None
    compile_cache_key: str = "default"


STARTUP_DEFAULTS = StartupSettings()


class ColdStart:
    """One start of the twin: decides hit or miss up front, then runs the phases in order."""

    def __init__(self, settings: StartupSettings, weight_bytes_per_host: float) -> None:
        self.settings = settings
        self.directory = Path(settings.compile_cache_dir) if settings.compile_cache_dir else None
        self.hit = sim_cache_holds(self.directory, settings.compile_cache_key)
        self.modelled = settings.figures.phases(weight_bytes_per_host, self.hit)
        self.measured: dict[str, float] = {}

    @property
    def cache_result(self) -> CacheResult:
        return "hit" if self.hit else "miss"

    async def run(self, phases: Sequence[str]) -> None:
        for phase in phases:
            began = time.perf_counter()
            await asyncio.sleep(self.modelled[phase] * self.settings.time_scale)
            if phase == "compile" and not self.hit and self.directory is not None:
                try:
                    write_sim_cache_entry(self.directory, self.settings.compile_cache_key)
                except OSError as err:  # as XLA: a cache it cannot write only costs time
                    log.warning("compile cache not written: %s", err)
            self.measured[phase] = time.perf_counter() - began
            cache = f", compile cache {self.cache_result}" if phase == "compile" else ""
            log.info(
                "cold start: %s took %.2f s (%.1f s at real scale%s)",
                phase, self.measured[phase], self.modelled[phase], cache,
            )  # fmt: skip

    def report(self) -> ColdStartReport:
        return ColdStartReport(
            dict(self.measured), self.cache_result, self.settings.compile_cache_key
        )
