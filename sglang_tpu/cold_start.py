"""A TPU engine's cold start, phase by phase: the twin's model of it and the report engines give.

A replica that starts from nothing goes through four phases, in order:

- ``pull``: the node pulls the engine image (0 when the node already has it);
- ``weights``: every host reads its share of the weights (model bytes / hosts) at the host's
  read bandwidth (GCS FUSE, Hyperdisk ML or a local SSD);
- ``compile``: XLA compiles the programs for the warmup shapes; minutes when the compile
  cache has no entry for this key, much less when it has;
- ``warmup``: SGLang's warmup request; `/health` answers 503 until it is done.

The default figures (`TPU_FIGURES`, at real scale) and where they come from:

- compile: measured on a TPU v5e chip with TorchTPU 0.2.0 (`torch.compile(backend="tpu")`,
  one program per step shape, `bench/tpu_results/v5e-2026-12-06/` and
  `tests/tpu/results/`): a step shape's first call took ~1.0 s per decoder layer + 2 s cold
  (8 layers 10.9 s, 28 layers 28.6-45.8 s, 36 layers 35.9 s) and ~0.34 s per layer + 1.2 s
  when a second process found the launcher's cache volume (PyTorch's FX-graph/AOTAutograd
  caches and TorchTPU's tier 3) warm (8 layers 3.9 s, 28 layers 9.9-11.5 s). An engine
  compiles one program per warmup shape (`WARMUP_SHAPES`, 8: batch and prefill-length buckets
  [verify] against SGLang-TorchTPU's warmup), so `compile_figures(layers)` scales both by
  layers and shapes: a 32-layer model 272 s cold, 97 s warm. The earlier defaults (340 s /
  135 s, vllm-project/tpu-inference#1707) are of the same order;
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


# Measured per step shape on a v5e chip (see the module docstring): seconds per decoder layer
# and fixed, cold and with the cache volume warm.
COMPILE_COLD_SECONDS_PER_LAYER: Final = 1.0
COMPILE_COLD_SECONDS_FIXED: Final = 2.0
COMPILE_WARM_SECONDS_PER_LAYER: Final = 0.34
COMPILE_WARM_SECONDS_FIXED: Final = 1.2
WARMUP_SHAPES: Final = 8


def compile_figures(layers: int, shapes: int = WARMUP_SHAPES) -> tuple[float, float]:
    """(cold, warm) compile seconds of an engine's warmup for a model of `layers` layers."""
    if layers < 1 or shapes < 1:
        raise ValueError(f"layers {layers!r}, shapes {shapes!r}: both must be >= 1")
    cold = shapes * (COMPILE_COLD_SECONDS_FIXED + COMPILE_COLD_SECONDS_PER_LAYER * layers)
    warm = shapes * (COMPILE_WARM_SECONDS_FIXED + COMPILE_WARM_SECONDS_PER_LAYER * layers)
    return cold, warm


_DEFAULT_COLD, _DEFAULT_WARM = compile_figures(32)  # Llama-3.1-8B, the default profile
TPU_FIGURES: Final = ColdStartFigures(
    compile_cold_seconds=_DEFAULT_COLD, compile_warm_seconds=_DEFAULT_WARM
)


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
