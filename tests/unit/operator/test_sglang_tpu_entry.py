"""A rendered TPU pod of `engine.type: sglang` starts SGLang through the TorchTPU adapter's
entry (`python -m sglang_tpu.sglang_tpu_server`) with SGLang's own flags; the cpu device keeps
SGLang's `launch_server`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sglang_tpu import launch
from sglang_tpu.sglang_flags import SGLANG_MODULE, TPU_SGLANG_MODULE
from tests.unit.operator.conftest import RenderFn, SpecWith

pytestmark = pytest.mark.unit

# one chip: the adapter's one-process engine runs at world size 1
QWEN3_06B = {"source": "hf://Qwen/Qwen3-0.6B"}
SGLANG = {"type": "sglang"}


def planned(rendered: Any, capsys: pytest.CaptureFixture[str], **extra: str) -> dict[str, Any]:
    """What the launcher makes of the engine container's launch contract."""
    (statefulset,) = [c for c in rendered.group(0) if c["kind"] == "StatefulSet"]
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    (engine,) = [c for c in containers if c["name"] == "engine"]
    env = {e["name"]: e["value"] for e in engine["env"] if e.get("value") is not None}
    contract = {k: v for k, v in env.items() if k.startswith("TPUSERVE_")}
    contract |= {"TPUSERVE_HOST_INDEX": "0", "TPUSERVE_WEIGHTS_CACHE_DIR": "/w"} | extra
    assert launch.launch(contract, dry_run=True) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_a_tpu_pod_starts_sglang_through_the_adapters_entry(
    rendered: RenderFn, spec_with: SpecWith, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_with(model=QWEN3_06B, tpu={"generation": "v5e", "topology": "1x1"}, engine=SGLANG)
    plan = planned(rendered(spec), capsys)
    command = plan["command"]
    assert command[1:3] == list(TPU_SGLANG_MODULE)
    assert "sglang.launch_server" not in " ".join(command)
    # SGLang's flags, unchanged: the entry hands them to SGLang's own parser
    assert command[command.index("--device") + 1] == "tpu"
    assert "--model-path" in command
    assert "--enable-cache-report" in command
    # SGLang's host side imports `sgl_kernel`: the pure-torch one goes on the path
    assert plan["env"]["PYTHONPATH"].endswith("cpu_shim")


def test_the_cpu_device_keeps_sglangs_launch_server(
    rendered: RenderFn, spec_with: SpecWith, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_with(model=QWEN3_06B, tpu={"generation": "v5e", "topology": "1x1"}, engine=SGLANG)
    plan = planned(rendered(spec), capsys, TPUSERVE_DEVICE="cpu")
    assert plan["command"][1:3] == list(SGLANG_MODULE)
