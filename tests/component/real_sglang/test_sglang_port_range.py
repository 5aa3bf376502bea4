"""`tpuserve.cluster.ports` stays out of the range where SGLang picks an engine's rendezvous
port, read from the installed SGLang's source (its default `--nccl-port` choice). The source is
parsed, not imported: importing SGLang loads torch, minutes on a loaded machine."""

from __future__ import annotations

import ast

import pytest

from tests.real_sglang import RealSGLang
from tpuserve.cluster import ports

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]


def defaults_of(source: str, function: str) -> dict[str, object]:
    """The literal defaults of `function`'s keyword parameters in `source`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            params = node.args.args[len(node.args.args) - len(node.args.defaults) :]
            return {
                a.arg: ast.literal_eval(d) for a, d in zip(params, node.args.defaults, strict=True)
            }
    raise AssertionError(f"{function} not found")


def test_free_ports_never_hand_out_a_port_sglang_may_pick_for_its_rendezvous(
    real_sglang: RealSGLang,
) -> None:
    (package,) = real_sglang.python.parent.parent.glob("lib/python3*/site-packages/sglang/srt")
    server_args = (package / "server_args.py").read_text()
    assert "nccl_port = get_free_port_below_ephemeral()" in server_args
    found = defaults_of((package / "utils" / "network.py").read_text(),
                        "get_free_port_below_ephemeral")  # fmt: skip
    sglang = range(int(str(found["low"])), int(str(found["high"])) + 1)
    assert sglang == ports.SGLANG_RENDEZVOUS_PORTS, found
    chosen = [*ports.free_ports(64), ports.free_port_pair()]
    assert not [p for p in chosen if p in sglang]
