"""The engine twin's HTTP server: SGLang's paths and JSON shapes over the shared engine core.

`create_app(settings)` builds the aiohttp application; its cleanup context owns the
`EngineService` (the engine loop task and the KV-event publisher) and runs the cold start
(`startup`): pull, weights and compile before the port opens, warmup after it (`/health`
503 until it is done). The handlers live by
route family:

- `native_api`: ``/generate``;
- `openai_api`: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``;
- `jax_api`: what the SGLang-JAX flavour (``--flavor sglang-jax``) answers instead of
  `info_api`'s SGLang routes (``/get_server_info``, ``/get_model_info``, ``/get_load``,
  ``/metrics``, and 404 for SGLang's routes it lacks);
- `info_api`: ``/health``, ``/health_generate``, ``/get_model_info`` (and ``/model_info``),
  ``/get_server_info`` (and ``/server_info``), ``/flush_cache``, ``/metrics``, ``/get_load``,
  ``/v1/loads``, plus the tpuserve-specific ``/debug/radix_cache``.

A request body must arrive within ``body_timeout_seconds`` (408, and the connection closes;
a client gone mid-body gets nothing), and a client's malformed HTTP or lost connection is
logged as one line at INFO, not as an ERROR traceback (`ClientErrorsInOneLine`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.typedefs import Handler, Middleware

from sglang_tpu.sim import info_api, jax_api, native_api, openai_api
from sglang_tpu.sim.pd import FAULTS, MAX_FAULTS
from sglang_tpu.sim.responses import json_response
from sglang_tpu.sim.service import SERVICE, SGLANG_JAX, EngineService, ServerSettings
from sglang_tpu.sim.startup import AFTER_LISTENING, BEFORE_LISTENING, ColdStart
from sglang_tpu.tasks import cancel_and_wait

MAX_REQUEST_BYTES = 64 * 1024 * 1024
CLIENT_ERRORS = (BadHttpMessage, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
"""What a client's malformed input or early departure raises: its problem, not the server's."""


def body_in_time(seconds: float) -> Middleware:
    """Read a request's body before its handler, within ``seconds``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            try:
                async with asyncio.timeout(seconds):
                    await request.read()  # kept by aiohttp: the handler's read returns it
            except TimeoutError:
                message = f"the request body did not arrive within {seconds:g} s"
                response = json_response({"error": {"message": message}}, status=408)
                response.force_close()
                return response
            except CLIENT_ERRORS:
                return web.Response(status=400)  # the client is gone: nobody reads this
        return await handler(request)

    return middleware


class ClientErrorsInOneLine(logging.Filter):
    """aiohttp logs a client's malformed request or lost connection as an ERROR with a
    traceback; make it one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, CLIENT_ERRORS):
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {str(error).strip()}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


async def _warm_up(svc: EngineService, cold: ColdStart) -> None:
    await cold.run(AFTER_LISTENING)
    svc.mark_up(cold.report())


async def handle_pd_fault(request: web.Request) -> web.Response:
    """``POST /debug/pd_fault {"kind": K, "count": N}``: the next N transfers of this prefill
    twin fail as K (`sglang_tpu.sim.pd.FAULTS`)."""
    pd_role = request.app[SERVICE].pd
    data = await request.json()
    kind, count = data.get("kind"), data.get("count", 1)
    if pd_role is None or pd_role.settings.mode != "prefill":
        return json_response({"error": {"message": "faults are for a prefill twin"}}, 400)
    if kind not in FAULTS or not isinstance(count, int) or not 0 < count <= MAX_FAULTS:
        message = (
            f"kind: {kind!r}, count: {count!r} is not allowed; allowed: kind one of "
            f"{', '.join(FAULTS)}, count 1..{MAX_FAULTS}"
        )
        return json_response({"error": {"message": message}}, 400)
    pd_role.faults.extend([kind] * count)
    del pd_role.faults[:-MAX_FAULTS]
    return json_response({"faults": pd_role.faults})


def create_app(settings: ServerSettings) -> web.Application:
    app = web.Application(
        client_max_size=MAX_REQUEST_BYTES, middlewares=[body_in_time(settings.body_timeout_seconds)]
    )
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ClientErrorsInOneLine) for f in server_log.filters):
        server_log.addFilter(ClientErrorsInOneLine())

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        svc = EngineService(settings)
        app[SERVICE] = svc
        await svc.start()
        timer = settings.timer
        cold = ColdStart(settings.startup, timer.weight_bytes / timer.shape.hosts)
        await cold.run(BEFORE_LISTENING)  # the port opens after these, as SGLang's does
        warmup: asyncio.Task[None] | None = None
        if settings.startup.time_scale > 0:
            warmup = asyncio.get_running_loop().create_task(_warm_up(svc, cold))
        else:
            await _warm_up(svc, cold)  # instant: up before the first request can arrive
        yield
        await cancel_and_wait([warmup])
        await svc.stop()

    app.cleanup_ctx.append(lifetime)
    native_api.add_routes(app.router)
    openai_api.add_routes(app.router)
    info_api.add_common_routes(app.router)
    if settings.flavor == SGLANG_JAX:
        jax_api.add_routes(app.router)
    else:
        info_api.add_routes(app.router)
    if settings.pd.enabled and settings.enable_debug_endpoints:
        app.router.add_post("/debug/pd_fault", handle_pd_fault)
    return app
