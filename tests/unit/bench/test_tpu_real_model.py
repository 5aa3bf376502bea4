"""bench/tpu_real_model.py and its adapter (sglang_tpu/sglang_torchtpu.py), without torch or SGLang.

The chip runs are in bench/tpu_results/v5e-2026-12-06b/ (docs/tpu-lane.md); here: the
stand-ins for packages SGLang imports but never calls, the op log's reading after an abort,
and the token comparison of the summary.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from sglang_tpu import sglang_torchtpu as adapter
from tests.bench_scripts import load_bench_script

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load() -> ModuleType:
    return load_bench_script("tpu_real_model", "tpu_real_model")


def test_a_missing_package_becomes_a_stand_in_and_a_present_one_does_not() -> None:
    name = "tpuserve_no_such_package_xyz"
    stubbed = adapter.install_missing_module_stubs({name, "json"})
    assert stubbed == [name]
    module = importlib.import_module(f"{name}.sub.deeper")
    assert module.__name__ == f"{name}.sub.deeper"
    # What SGLang does with such imports at load time: decorate, subclass, read flags.
    from tpuserve_no_such_package_xyz import Struct, jit  # type: ignore[import-not-found]

    @jit  # type: ignore[untyped-decorator]
    def kernel() -> int:
        return 7

    assert kernel() == 7

    class Sub(Struct, frozen=True):  # type: ignore[misc,call-arg]  # kwargs to __init_subclass__
        pass

    assert isinstance(Sub(), Struct)
    assert not module.some_flag
    assert Struct.SOME_ENUM.VALUE is not None  # class attributes of a stand-in class
    assert list(module.anything) == []


def test_the_op_log_names_the_op_that_started_and_never_finished(tmp_path: Path) -> None:
    bench = _load()
    log = tmp_path / "oplog.txt"
    log.write_text(
        "START aten.mm.default (float32[2, 128]@tpu) ()\nOK aten.mm.default\n"
        "START aten._to_copy.default (int64[2]@tpu) (dtype,layout,device)\n"
    )
    assert bench._last_started(log) == "aten._to_copy.default (int64[2]@tpu) (dtype,layout,device)"
    log.write_text("START aten.mm.default ()\nOK aten.mm.default\n")
    assert bench._last_started(log) is None
    assert bench._last_started(tmp_path / "missing.txt") is None


def test_the_summary_compares_each_chip_run_with_the_cpus_tokens(tmp_path: Path) -> None:
    bench = _load()
    rows = [
        {
            "impl": "hf",
            "device": "cpu",
            "mode": "eager",
            "shape": "tiny",
            "ok": True,
            "tokens": [[1, 2], [3, 4], [5, 6]],
        },
        {
            "impl": "sglang",
            "device": "cpu",
            "mode": "eager",
            "shape": "tiny",
            "ok": True,
            "tokens": [[1, 2], [3, 4], [5, 6]],
        },
        {
            "impl": "hf",
            "device": "tpu",
            "mode": "eager",
            "shape": "tiny",
            "ok": True,
            "tokens": [[1, 2], [3, 4], [5, 9]],
        },
        {
            "impl": "sglang",
            "device": "tpu",
            "mode": "eager",
            "shape": "tiny",
            "ok": False,
            "abort": True,
            "aborting_op": "aten.cumsum.default",
        },
    ]
    results = tmp_path / "real-model.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench.summarise(results, tmp_path / "summary.json")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cpu_sglang_equals_cpu_hf"] is True
    chip = [r for r in summary["rows"] if r["device"] == "tpu"]
    assert chip[0]["tokens_equal_cpu"] is False
    assert chip[0]["tokens_equal_cpu_first_n"] == 2
    assert "tokens_equal_cpu" not in chip[1]
    assert chip[1]["aborting_op"] == "aten.cumsum.default"


def test_the_committed_results_record_the_blocker_and_the_runs() -> None:
    results = json.loads((BENCH / "tpu_results" / "v5e-2026-12-06b" / "results.json").read_text())
    assert results["cpu_reference"]["sglang_equals_hf_on_cpu"] is True
    assert results["sglang_on_tpu"]["ran"] is False
    assert "cumsum" in results["sglang_on_tpu"]["blockers"][0]["op"]
    equal = [r for r in results["tpu_runs"] if r["tokens_equal_cpu"]]
    assert equal
    assert all(r["float32_matmul_precision"] == "highest" for r in equal)


def test_integer_cumsums_of_device_tensors_go_through_the_host() -> None:
    """The workaround for the chip's cumsum abort: only integer device inputs move."""
    calls: list[str] = []

    class Tensor:
        def __init__(self, device: str, floating: bool) -> None:
            self.device = SimpleNamespace(type=device)
            self.floating = floating

        def is_floating_point(self) -> bool:
            return self.floating

        def is_complex(self) -> bool:
            return False

        def cpu(self) -> Tensor:
            calls.append("cpu")
            return Tensor("cpu", self.floating)

        def to(self, device: object) -> Tensor:
            calls.append(f"to {device.type}")  # type: ignore[attr-defined]
            return Tensor(device.type, self.floating)  # type: ignore[attr-defined]

    def cumsum(x: Tensor, dim: int) -> Tensor:
        calls.append(f"cumsum on {x.device.type}")
        return x

    def disable(fn: Any) -> Any:  # torch.compiler.disable: the round trip breaks the graph
        def disabled(*args: Any, **kwargs: Any) -> Any:
            calls.append("graph break")
            return fn(*args, **kwargs)

        return disabled

    fake_torch = SimpleNamespace(
        cumsum=cumsum, int64="int64", compiler=SimpleNamespace(disable=disable)
    )
    proxy = adapter._HostIntegerCumsum(fake_torch)
    assert proxy.int64 == "int64"  # everything else is torch's
    proxy.cumsum(Tensor("tpu", floating=False), 0)
    assert calls == ["graph break", "cpu", "cumsum on cpu", "to tpu"]
    calls.clear()
    proxy.cumsum(Tensor("tpu", floating=True), 0)
    proxy.cumsum(Tensor("cpu", floating=False), 0)
    assert calls == ["cumsum on tpu", "cumsum on cpu"]
