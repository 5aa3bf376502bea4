"""SGLang's native generation route, ``/generate``, on the twin (text or token ids in)."""

from __future__ import annotations

import contextlib
from typing import Any

from aiohttp import web

from sglang_tpu.sim.generation import RequestRejected, prepare, run_request, run_to_end
from sglang_tpu.sim.output_text import output_text
from sglang_tpu.sim.protocol import InvalidRequest, parse_generate, parse_json
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.responses import json_response, sse_done, sse_event, sse_start
from sglang_tpu.sim.service import EngineService, service_of


def _meta_info(svc: EngineService, req: Request) -> dict[str, Any]:
    return {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "e2e_latency": (req.finish_time or svc.now()) - req.arrival_time,
        "weight_version": "default",
    }


def _body(svc: EngineService, req: Request) -> dict[str, Any]:
    return {
        "text": output_text(req, svc.core.palette),
        "output_ids": list(req.output_ids),
        "meta_info": _meta_info(svc, req),
    }


async def handle_generate(request: web.Request) -> web.StreamResponse:
    svc = service_of(request)
    try:
        gen = parse_generate(parse_json(await request.read()))
        ids = gen.input_ids if gen.input_ids is not None else svc.tokenizer.encode(gen.text or "")
        req = prepare(svc, gen, ids, openai=False)
    except InvalidRequest as err:
        return json_response(
            {"error": {"message": str(err), "type": "BadRequestError", "param": err.param,
                       "code": err.status}},
            status=err.status,
        )  # fmt: skip
    try:
        if not gen.stream:
            await run_to_end(svc, req)
            return json_response(_body(svc, req))
        resp: web.StreamResponse | None = None
        async with contextlib.aclosing(run_request(svc, req, stream=True)) as run:
            async for _ in run:
                if resp is None:
                    resp = await sse_start(request)
                await sse_event(resp, _body(svc, req))
        assert resp is not None
        return await sse_done(resp)
    except RequestRejected as rejected:
        return rejected.response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/generate", handle_generate)
    router.add_put("/generate", handle_generate)
