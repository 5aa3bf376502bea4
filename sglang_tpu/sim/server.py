"""The engine twin's HTTP server: SGLang's paths and JSON shapes over the shared engine core.

`create_app(settings)` builds the aiohttp application; its cleanup context owns the
`EngineService` (the engine loop task and the KV-event publisher). The handlers live by
route family:

- `native_api`: ``/generate``;
- `openai_api`: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``;
- `info_api`: ``/health``, ``/health_generate``, ``/get_model_info`` (and ``/model_info``),
  ``/get_server_info`` (and ``/server_info``), ``/flush_cache``, ``/metrics``, ``/get_load``,
  ``/v1/loads``, plus the tpuserve-specific ``/debug/radix_cache``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from sglang_tpu.sim import info_api, native_api, openai_api
from sglang_tpu.sim.service import SERVICE, EngineService, ServerSettings

MAX_REQUEST_BYTES = 64 * 1024 * 1024


def create_app(settings: ServerSettings) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        svc = EngineService(settings)
        app[SERVICE] = svc
        await svc.start()
        yield
        await svc.stop()

    app.cleanup_ctx.append(lifetime)
    native_api.add_routes(app.router)
    openai_api.add_routes(app.router)
    info_api.add_routes(app.router)
    return app
