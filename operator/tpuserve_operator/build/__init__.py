"""What is derived from the operator's sources (`api.py`, `rbac.py`, `peering.py`) at build time.

Nothing here runs in the operator process:

- `openapi.py`, `crd.py`: the CRD's structural OpenAPI schema and the CRD itself;
- `cel.py`: the CRD's CEL rules evaluated offline (`tpuserve render`; the operator leaves them
  to the apiserver);
- `docs.py`: the generated sections of docs/operator.md;
- `generate.py`: `python -m tpuserve_operator.build.generate [--check]` writes the CRDs, the
  chart's RBAC rules file and those docs sections.
"""
