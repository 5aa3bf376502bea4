"""The model-server image pins what pyproject's `tpu` extra says, runs non-root, runs the launcher.

The image cannot be built here (no TPU wheels are exercised in CI), so its Dockerfile is
checked as text against the one place the versions are declared.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from sglang_tpu.contract.group_contract import GroupContract

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "sglang_tpu" / "Dockerfile").read_text()


def tpu_extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["optional-dependencies"]["tpu"]]
    return {r.name: r for r in requirements}


def pip_installs() -> list[str]:
    """Each `pip install` command of the Dockerfile, continuation lines joined."""
    joined = DOCKERFILE.replace("\\\n", " ")
    runs = re.findall(r"^RUN (.+)$", joined, re.MULTILINE)
    return [c.strip() for run in runs for c in run.split("&&") if "pip install" in c]


def arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert match, f"Dockerfile has no ARG {name} default"
    return match.group(1)


def test_torch_tpu_is_pinned_to_the_extras_version() -> None:
    assert tpu_extra()["torch-tpu"].specifier.contains(arg("TORCH_TPU_VERSION"))
    assert str(tpu_extra()["torch-tpu"].specifier) == f"=={arg('TORCH_TPU_VERSION')}"


def test_torch_is_a_version_the_extra_allows_and_comes_from_the_cpu_index() -> None:
    assert tpu_extra()["torch"].specifier.contains(Version(arg("TORCH_VERSION")))
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu"
    assert f'{cpu_index} "torch==${{TORCH_VERSION}}"' in DOCKERFILE
    # every other resolving install names the same torch, so pip cannot swap in a CUDA build
    for command in pip_installs()[1:]:
        if "--no-deps" not in command:
            assert "torch==${TORCH_VERSION}" in command, command
            assert "https://download.pytorch.org/whl/cpu" in command, command


def test_sglang_is_the_extras_version_installed_without_cuda_dependencies() -> None:
    assert str(tpu_extra()["sglang"].specifier) == f"=={arg('SGLANG_VERSION')}"
    assert arg("SGLANG_SPEC") == "sglang==${SGLANG_VERSION}"
    assert 'pip install --no-deps "${SGLANG_SPEC}"' in DOCKERFILE


def test_python_matches_the_only_torch_tpu_wheel() -> None:
    assert arg("PYTHON_VERSION") == "3.11"


def test_runs_as_a_non_root_user_with_the_launcher_as_entrypoint() -> None:
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert users
    assert users[-1].split(":")[0] not in ("0", "root")
    assert DOCKERFILE.rstrip().endswith('ENTRYPOINT ["tini", "--", "tpuserve", "engine", "launch"]')


def test_runtime_writes_only_to_tmp() -> None:
    for name in ("HOME", "XDG_CACHE_HOME", "TMPDIR"):
        assert re.search(rf"\b{name}=/tmp\b", DOCKERFILE), name
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE


def test_copied_sources_exist() -> None:
    for source in re.findall(r"^COPY (?!--from)(.+) /src/\S*$", DOCKERFILE, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), path


def test_exposed_ports_are_the_contract_defaults() -> None:
    exposed = re.search(r"^EXPOSE (.+)$", DOCKERFILE, re.MULTILINE)
    assert exposed
    fields = GroupContract.model_fields
    defaults = {
        str(fields[name].default)
        for name in ("http_port", "kv_events_port", "master_port", "tpu_process_port")
    }
    assert defaults <= set(exposed.group(1).split())
    assert (
        f"{fields['dist_init_port'].default}-{fields['dist_init_port'].default + 6}"
        in exposed.group(1)
    )
