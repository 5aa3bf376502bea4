"""The CPU `sgl_kernel` stand-in imports without torch and names any op it does not provide."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_tpu.cpu_shim import PYTHONPATH_ENTRY, sgl_kernel

pytestmark = pytest.mark.unit


def test_pythonpath_entry_is_the_folder_holding_the_sgl_kernel_package() -> None:
    assert Path(sgl_kernel.__file__).parent == PYTHONPATH_ENTRY / "sgl_kernel"


def test_provided_ops_are_the_two_the_cpu_engine_imports() -> None:
    assert sgl_kernel.PROVIDED_OPS == (
        "assign_req_to_token_pool_cpu",
        "copy_all_layer_kv_cache_cpu",
    )
    for name in sgl_kernel.PROVIDED_OPS:
        assert callable(getattr(sgl_kernel, name))


def test_any_other_op_imports_but_raises_not_implemented_naming_it() -> None:
    op = sgl_kernel.build_tree_kernel_efficient_cpu  # imported at load time by SGLang's CPU path
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.build_tree_kernel_efficient_cpu"):
        op(1, 2)
    assert op.__name__ == "build_tree_kernel_efficient_cpu"


def test_module_protocol_probes_get_attribute_error() -> None:
    assert not hasattr(sgl_kernel, "__wrapped__")
