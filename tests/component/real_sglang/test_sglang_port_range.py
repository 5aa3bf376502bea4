"""`tpuserve.cluster.ports` stays out of the range where SGLang picks an engine's rendezvous
port, read from the installed SGLang (its default `--nccl-port` choice)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.real_sglang import RealSGLang
from tpuserve.cluster import ports

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

READ_RANGE = """
import inspect, json
from sglang.srt.server_args import PortArgs
from sglang.srt.utils import network
source = inspect.getsource(PortArgs.init_new)
defaults = inspect.signature(network.get_free_port_below_ephemeral).parameters
print(json.dumps({
    "picks_below_ephemeral": "get_free_port_below_ephemeral()" in source,
    "low": defaults["low"].default,
    "high": defaults["high"].default,
}))
"""


def test_free_ports_never_hand_out_a_port_sglang_may_pick_for_its_rendezvous(
    real_sglang: RealSGLang,
) -> None:
    result = subprocess.run(
        [str(real_sglang.python), "-c", READ_RANGE],
        env=real_sglang.environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["picks_below_ephemeral"], found
    sglang = range(found["low"], found["high"] + 1)
    assert sglang == ports.SGLANG_RENDEZVOUS_PORTS, found
    chosen = [*ports.free_ports(64), ports.free_port_pair()]
    assert not [p for p in chosen if p in sglang]
