"""tpuserve's pure-torch `sgl_kernel` ops match naive references, run in the real-SGLang venv."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.real_sglang import RealSGLang

CHECKER = Path(__file__).with_name("shim_semantics.py")

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]


def test_shim_ops_match_naive_references(real_sglang: RealSGLang) -> None:
    result = subprocess.run(
        [str(real_sglang.python), str(CHECKER)],
        env=real_sglang.environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "assign_req_to_token_pool_cpu: 200 cases match" in result.stdout
    assert "copy_all_layer_kv_cache_cpu: 200 cases match" in result.stdout
