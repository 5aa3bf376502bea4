"""The TPUModelServer schema, one module per part of the resource.

Import the models from `tpuserve_operator.api`, which re-exports every public name of these
modules (its docstring says what is generated from them).
"""
