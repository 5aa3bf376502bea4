"""A TPU engine's cold start, phase by phase: the twin's model of it and the report engines give.

A replica that starts from nothing goes through four phases, in order:

- ``pull``: the node pulls the engine image (0 when the node already has it);
- ``weights``: every host reads its share of the weights (model bytes / hosts) at the host's
  read bandwidth (GCS FUSE, Hyperdisk ML or a local SSD);
- ``compile``: XLA compiles the programs for the warmup shapes; minutes when the compile
  cache has no entry for this key, much less when it has;
- ``warmup``: SGLang's warmup request; `/health` answers 503 until it is done.

The default figures (`TPU_FIGURES`, at real scale) and where they come from:

- compile 340 s cold, 135 s with a warm cache: vllm-project/tpu-inference#1707 (XLA compile
  of a served model on TPU, without and with the persistent cache); vllm-project/vllm#7533
  reports 10-30 min cold and 1-3 min cached for larger models;
- weights at 1.2 GB/s per host: a Hyperdisk ML volume's per-VM throughput or GCS FUSE with
  parallel downloads, order of magnitude [verify];
- warmup 5 s, pull 0 s (image cached on the node) [verify].

`ColdStartReport` is what an engine reports once it is up (the twin on `/server_info` and
`/metrics`): the seconds each phase took and whether the compile cache held the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

PHASES: Final = ("pull", "weights", "compile", "warmup")
Phase = Literal["pull", "weights", "compile", "warmup"]
CacheResult = Literal["hit", "miss"]
CACHE_RESULTS: Final[tuple[CacheResult, ...]] = ("hit", "miss")
GB: Final = 1e9
# What the twin writes below its keyed compile-cache directory after a cold compile.
SIM_CACHE_ENTRY: Final = "tpuserve-sim-compiled.json"


@dataclass(frozen=True, slots=True)
class ColdStartFigures:
    """The modelled durations at real scale (seconds) and the weight read bandwidth."""

    pull_seconds: float = 0.0
    read_gb_per_second: float = 1.2
    compile_cold_seconds: float = 340.0
    compile_warm_seconds: float = 135.0
    warmup_seconds: float = 5.0

    def phases(self, weight_bytes_per_host: float, cache_hit: bool) -> dict[str, float]:
        """Seconds of each phase (in `PHASES` order) at real scale."""
        compile_seconds = self.compile_warm_seconds if cache_hit else self.compile_cold_seconds
        return {
            "pull": self.pull_seconds,
            "weights": weight_bytes_per_host / (self.read_gb_per_second * GB),
            "compile": compile_seconds,
            "warmup": self.warmup_seconds,
        }


TPU_FIGURES: Final = ColdStartFigures()


@dataclass(frozen=True, slots=True)
class ColdStartReport:
    """How one engine start went: seconds by phase, and the compile cache's answer."""

    seconds: Mapping[str, float]
    cache_result: CacheResult
    cache_key: str = ""

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "phases": {phase: round(self.seconds.get(phase, 0.0), 3) for phase in PHASES},
            "compile_cache": {"result": self.cache_result, "key": self.cache_key},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ColdStartReport:
        """The report from `as_json`'s shape; ValueError when it is not one."""
        try:
            phases = data["phases"]
            cache = data["compile_cache"]
            seconds = {phase: float(phases[phase]) for phase in PHASES}
            result = cache["result"]
            key = str(cache.get("key") or "")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a cold-start report: {err!r}") from None
        if result not in CACHE_RESULTS:
            raise ValueError(f"compile_cache.result {result!r}; allowed: {CACHE_RESULTS}")
        return cls(seconds, result, key)


def sim_cache_holds(directory: Path | None, key: str) -> bool:
    """Whether the twin's entry for `key` is in its keyed compile-cache directory."""
    if directory is None:
        return False
    try:
        entry = json.loads((directory / SIM_CACHE_ENTRY).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(entry, dict) and entry.get("key") == key


def write_sim_cache_entry(directory: Path, key: str) -> None:
    """Record a finished compile for `key` (atomically, as XLA's cache writes its entries)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{SIM_CACHE_ENTRY}.{os.getpid()}"  # replicas may write at once
    partial.write_text(json.dumps({"key": key}))
    partial.replace(directory / SIM_CACHE_ENTRY)
