"""The `tpuserve` command: a thin layer over the operator, the router and sglang_tpu."""

__version__ = "0.1.0.dev0"
