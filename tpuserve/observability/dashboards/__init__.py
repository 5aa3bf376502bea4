"""tpuserve's Grafana dashboards as code (grafana-foundation-sdk 0.0.21, schemaVersion 42).

`DASHBOARDS` maps each file name under `charts/tpuserve/dashboards/` to the function building
it; the generator serialises them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from grafana_foundation_sdk.builders.dashboard import Dashboard

from tpuserve.observability.dashboards import fleet as fleet
from tpuserve.observability.dashboards import gateway as gateway
from tpuserve.observability.dashboards import model as model
from tpuserve.observability.dashboards import operator as operator
from tpuserve.observability.dashboards import pd as pd
from tpuserve.observability.dashboards import router as router
from tpuserve.observability.dashboards import tpu as tpu

DASHBOARDS: Mapping[str, Callable[[], Dashboard]] = MappingProxyType(
    {
        "tpuserve-fleet-overview": fleet.build,
        "tpuserve-model-detail": model.build,
        "tpuserve-router": router.build,
        "tpuserve-tpu-utilisation": tpu.build,
        "tpuserve-operator": operator.build,
        "tpuserve-pd": pd.build,
        "tpuserve-gateway": gateway.build,
    }
)
