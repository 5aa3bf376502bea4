"""The SGLang-JAX image pins the source commit the launcher's flags were read from.

sglang_tpu/Dockerfile.sglang-jax cannot be built here (no TPU wheels are exercised in CI and no
network), so it is checked as text against the code: the SGLang-JAX commit is the flag table's
`SOURCE_COMMIT`, JAX is the pre-flight's pin, Python is 3.12, it runs non-root with the
launcher as entrypoint, and it exposes the contract's ports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_tpu.contract.group_contract import GroupContract
from sglang_tpu.sgl_jax_server_args import SOURCE_COMMIT
from sglang_tpu.tpu_stack import JAX_VERSION

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "sglang_tpu" / "Dockerfile.sglang-jax").read_text()


def arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert match, f"Dockerfile.sglang-jax has no ARG {name} default"
    return match.group(1)


def test_sgl_jax_is_the_source_commit_the_flag_table_was_read_from() -> None:
    assert arg("SGLANG_JAX_COMMIT") == SOURCE_COMMIT
    source = arg("SGLANG_JAX_SOURCE")
    assert source == (
        "https://github.com/sgl-project/sglang-jax/archive/${SGLANG_JAX_COMMIT}.tar.gz"
    )
    assert '"sglang-jax @ ${SGLANG_JAX_SOURCE}#subdirectory=python"' in DOCKERFILE


def test_jax_is_the_preflights_pin_in_every_resolving_install() -> None:
    assert arg("JAX_VERSION") == JAX_VERSION
    joined = DOCKERFILE.replace("\\\n", " ")
    installs = [line for line in re.findall(r"^RUN (.+)$", joined, re.MULTILINE)
                if "pip install" in line]  # fmt: skip
    assert installs
    for command in installs:
        assert '"jax[tpu]==${JAX_VERSION}"' in command, command


def test_python_is_312_as_sgl_jax_requires() -> None:
    assert arg("PYTHON_VERSION") == "3.12"


def test_runs_non_root_with_the_launcher_and_writes_only_to_tmp() -> None:
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert users
    assert users[-1].split(":")[0] not in ("0", "root")
    assert DOCKERFILE.rstrip().endswith('ENTRYPOINT ["tini", "--", "tpuserve", "engine", "launch"]')
    for name in ("HOME", "XDG_CACHE_HOME", "TMPDIR"):
        assert re.search(rf"\b{name}=/tmp\b", DOCKERFILE), name


def test_copied_sources_exist_and_the_contract_ports_are_exposed() -> None:
    for source in re.findall(r"^COPY (?!--from)(.+) /src/\S*$", DOCKERFILE, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), path
    exposed = re.search(r"^EXPOSE (.+)$", DOCKERFILE, re.MULTILINE)
    assert exposed
    fields = GroupContract.model_fields
    ports = exposed.group(1).split()
    assert str(fields["http_port"].default) in ports
    assert str(fields["tpu_process_port"].default) in ports
    dist = int(fields["dist_init_port"].default)
    assert f"{dist}-{dist + 6}" in ports
