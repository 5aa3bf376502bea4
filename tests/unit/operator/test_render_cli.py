"""`tpuserve render -f FILE`: children as YAML with no cluster; invalid input exits non-zero
with the same messages the operator's Valid condition carries."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tpuserve.cli import main
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.validation import validate

pytestmark = pytest.mark.unit

VALID = """
apiVersion: serving.tpuserve.dev/v1alpha1
kind: TPUModelServer
metadata: {name: qwen, namespace: ml}
spec:
  model: {source: hf://Qwen/Qwen3-8B}
  tpu: {generation: tpu7x, topology: 2x2x2}
  replicas: 1
"""

INVALID_SPEC = {
    "model": {"source": "hf://Qwen/Qwen3-8B"},
    "tpu": {"generation": "v6e", "topology": "3x3"},
    "engine": {"speculative": {"algorithm": "EAGLE3"}},
}


def test_prints_every_child_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tms.yaml"
    path.write_text(VALID)
    assert main(["render", "-f", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("StatefulSet") == 2  # tpu7x 2x2x2: leader + 1 worker
    assert "Deployment" in kinds
    assert all("ownerReferences" not in d["metadata"] for d in docs)


def test_leaderworkerset_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tms.yaml"
    path.write_text(VALID)
    assert main(["render", "-f", str(path), "--leaderworkerset"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds.count("LeaderWorkerSet") == 1
    assert "StatefulSet" not in kinds


def test_invalid_input_exits_1_with_the_condition_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(VALID)
    doc["spec"] = INVALID_SPEC
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    with pytest.raises(InvalidSpec) as caught:
        validate("qwen", INVALID_SPEC)
    for problem in caught.value.problems:
        assert f"ml/qwen: {problem} (reason {problem.reason})" in captured.err
    assert "spec.tpu.topology" in captured.err
    assert "spec.engine.speculative" in captured.err


def test_a_file_without_servers_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert main(["render", "-f", str(path)]) == 2
    assert "no TPUModelServer document" in capsys.readouterr().err


def test_wrong_api_version_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(VALID.replace("v1alpha1", "v1"))
    assert main(["render", "-f", str(path)]) == 1
    assert "apiVersion: 'serving.tpuserve.dev/v1' is not allowed" in capsys.readouterr().err
