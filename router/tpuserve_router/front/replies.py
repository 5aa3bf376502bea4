"""An answer the router writes and counts itself, outside the pipeline (the admin API, a
route not found); the pipeline's own are `tpuserve_router.pipeline.client`'s."""

from __future__ import annotations

from tpuserve_router.front.http_request import HttpRequest
from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.pipeline.client import reply_error
from tpuserve_router.pipeline.request_body import ClientError


def reject(
    request: HttpRequest,
    err: ClientError,
    metrics: RouterMetrics,
    route: str,
    model: str = "",
    worker: str = "none",
) -> None:
    """Answer ``err`` and count it in ``tpuserve_router_requests_total``."""
    reply_error(request, err)
    metrics.requests.labels(model, worker, route, str(err.status)).inc()
