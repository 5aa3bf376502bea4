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


def _bomb(levels: int) -> str:
    """A YAML alias bomb of ``levels`` levels: 10**levels strings from a few lines."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join("      " + line for line in lines)


HOSTILE = {
    "an alias bomb": (
        VALID + "  template:\n    affinity:\n" + _bomb(9) + "\n",
        "document 1: more than 100000 values (with YAML aliases expanded)",
    ),
    "a long string aliased": (
        VALID
        + "  template:\n    annotations:\n      a0: &b "
        + "x" * 3_900_000
        + "\n"
        + "".join(f"      a{i}: *b\n" for i in range(1, 1000)),
        "document 1: more than 16777216 characters of strings (with YAML aliases expanded)",
    ),
    "deep nesting": (VALID.replace("replicas: 1", "replicas: " + "[" * 20000 + "]" * 20000),
                     "nested too deeply to parse"),
    "not UTF-8": (VALID.replace("qwen,", "q\udcffwen,"), "not UTF-8: byte "),
    "not YAML": ("a: [b\n", "while parsing a flow sequence"),
    # issue 57 item 9: the last of two equal keys used to win, silently
    "a duplicate key": (VALID + "  replicas: 4\n",
                        "line 9: key 'replicas' given twice in one mapping; allowed: each key"),
    "a duplicate key in flow": (VALID.replace("{name: qwen,", "{name: qwen, name: other,"),
                                "key 'name' given twice in one mapping"),
}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_files_are_refused_in_one_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, expected = HOSTILE[case]
    path = tmp_path / "hostile.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert main(["render", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"tpuserve render: {path}: ")
    assert expected in err


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ("", "TPUModelServer without metadata.name (got None)"),
        ("metadata: [a]", "TPUModelServer without metadata.name (got None)"),
        ("metadata: {name: 5}", "TPUModelServer without metadata.name (got 5)"),
        ("metadata: {name: Qwen_3}", "metadata.name: 'Qwen_3' is not allowed"),
    ],
)
def test_a_document_without_a_valid_name_is_refused(
    metadata: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tms.yaml"
    path.write_text(VALID.replace("metadata: {name: qwen, namespace: ml}", metadata))
    assert main(["render", "-f", str(path)]) == 1
    assert expected in capsys.readouterr().err


def test_replicas_true_is_not_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tms.yaml"
    path.write_text(VALID.replace("replicas: 1", "replicas: true"))
    assert main(["render", "-f", str(path)]) == 1
    assert "spec.replicas: True is not valid: Input should be a valid integer" in (
        capsys.readouterr().err
    )
