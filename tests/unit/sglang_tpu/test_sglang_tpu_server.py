"""The engine image's TPU entry (`sglang_tpu.sglang_tpu_server`) and what the image declares.

The image declares `TPUSERVE_SGLANG_KV_WRITES=eager` (which lets pre-flight allow a compiled
step on torch-tpu 0.2.x) only because the launcher starts SGLang on a TPU through the entry,
and the entry applies `keep_kv_pool_writes_eager` before SGLang's server starts. These tests
tie the three; tests/component/real_sglang/test_tpu_entry_on_real_sglang.py runs the entry against
real SGLang 0.5.23 (the patch in effect, an answer over HTTP).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import sglang_flags, sglang_torchtpu, sglang_tpu_server
from sglang_tpu.tpu_stack import KV_WRITES_ENV, KV_WRITES_VALUES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "sglang_tpu" / "Dockerfile").read_text()


def image_env() -> dict[str, str]:
    """The final stage's ENV assignments, continuation lines joined."""
    final = DOCKERFILE.split("\nFROM ")[-1].replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", final, re.MULTILINE):
        env |= dict(pair.split("=", 1) for pair in line.split())
    return env


def test_the_image_declares_the_kv_writes_the_entry_keeps() -> None:
    assert image_env()[KV_WRITES_ENV] == "eager"
    assert "eager" in KV_WRITES_VALUES
    # ... because a TPU's SGLang starts through the entry, which is in the image
    assert ("-m", sglang_tpu_server.__name__) == sglang_flags.TPU_SGLANG_MODULE
    assert re.search(r"^COPY sglang_tpu /src/sglang_tpu$", DOCKERFILE, re.MULTILINE)


def test_the_entry_applies_every_part_of_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def record(name: str, result: Any) -> Any:
        def call(*args: Any) -> Any:
            calls.append(name)
            return result

        return call

    monkeypatch.setattr(sglang_torchtpu, "install_missing_module_stubs", record("stubs", ["x"]))
    monkeypatch.setattr(
        sglang_torchtpu, "tolerate_missing_processor_backends", record("registrations", [])
    )
    monkeypatch.setattr(
        sglang_torchtpu, "route_integer_cumsum_through_host", record("cumsum", None)
    )
    monkeypatch.setattr(sglang_torchtpu, "keep_kv_pool_writes_eager", record("kv", None))
    applied = sglang_tpu_server.apply_adapter()
    assert calls == ["stubs", "registrations", "cumsum", "kv"]
    assert (applied.kv_writes, applied.host_cumsum, applied.stubbed) == ("eager", True, ["x"])


@pytest.mark.parametrize(("declared", "in_effect", "refused"), [
    ("eager", "graph", True),
    ("eager", "eager", False),
    (None, "graph", False),
    ("graph", "graph", False),
])  # fmt: skip
def test_a_false_declaration_stops_the_entry(
    monkeypatch: pytest.MonkeyPatch, declared: str | None, in_effect: str, refused: bool
) -> None:
    monkeypatch.setattr(sglang_tpu_server, "kv_writes_in_effect", lambda: in_effect)
    environ = {} if declared is None else {KV_WRITES_ENV: declared}
    if refused:
        with pytest.raises(SystemExit, match=f"{KV_WRITES_ENV}=eager"):
            sglang_tpu_server.check_declaration(environ)
    else:
        sglang_tpu_server.check_declaration(environ)


def test_the_stand_ins_never_cover_what_the_image_installs_for_the_server() -> None:
    """The HTTP server's packages are installed in the image: none may be stood in for."""
    served = {"fastapi", "uvicorn", "uvloop", "starlette", "prometheus_client", "zmq", "openai"}
    assert not served & sglang_tpu_server.STUB_PACKAGES
