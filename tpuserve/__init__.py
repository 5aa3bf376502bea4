"""The `tpuserve` command: a thin layer over the operator, the router and sglang_tpu."""

from sglang_tpu.version import tpuserve_version

__version__ = tpuserve_version()
