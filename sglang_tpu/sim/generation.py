"""What every generation route shares: a parsed request checked and turned into an engine
request, then run to completion (or streamed) with the client's disconnect as an abort."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from aiohttp import web

from sglang_tpu.sim.engine import QueueFull
from sglang_tpu.sim.protocol import GenerationRequest, InvalidRequest
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.responses import unavailable
from sglang_tpu.sim.service import EngineService


class RequestRejected(Exception):
    """The engine cannot take the request now; `response` is the answer to send."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


def prepare(
    svc: EngineService, gen: GenerationRequest, prompt_ids: list[int], openai: bool
) -> Request:
    """Check the prompt against the context length and vocabulary; InvalidRequest if not."""
    ctx = svc.settings.engine.context_length
    if len(prompt_ids) >= ctx:
        param = "messages" if gen.text is None and gen.input_ids is None else "prompt"
        if not openai:
            param = "text" if gen.text is not None else "input_ids"
        raise InvalidRequest(
            param,
            f"{param}: the prompt has {len(prompt_ids)} tokens; allowed: fewer than the "
            f"context length {ctx}",
        )
    vocab = svc.tokenizer.vocab_size
    bad = next((t for t in prompt_ids if t >= vocab), None)
    if bad is not None:
        raise InvalidRequest(
            "input_ids" if not openai else "prompt",
            f"token id {bad} is not allowed; allowed: ids below the vocabulary size {vocab}",
        )
    max_new = min(gen.max_new_tokens, ctx - len(prompt_ids))
    seed = gen.seed
    if seed is None and gen.temperature > 0:
        seed = svc.core.next_sampling_seed()
    return Request(
        gen.rid or svc.new_rid(),
        prompt_ids,
        max_new,
        stop_strings=gen.stop,
        stop_token_ids=gen.stop_token_ids,
        sampling_seed=seed,
        stream=gen.stream,
    )


async def run_request(svc: EngineService, req: Request, stream: bool) -> AsyncGenerator[int, None]:
    """Submit `req` and yield the output length each time it grows; aborts on disconnect."""
    wake = asyncio.Event()
    req.on_update = lambda _r: wake.set()
    if svc.draining:
        raise RequestRejected(unavailable("the server is draining"))
    try:
        svc.submit(req)
    except QueueFull as err:
        raise RequestRejected(unavailable(str(err))) from None
    try:
        sent = 0
        while not req.finished:
            await wake.wait()
            wake.clear()
            if stream and not req.finished and len(req.output_ids) > sent:
                sent = len(req.output_ids)  # not a chunked-prefill step: it adds no token
                yield sent
        yield len(req.output_ids)  # the finished state, once
    finally:
        if not req.finished:
            svc.core.abort(req, svc.now())


async def run_to_end(svc: EngineService, req: Request) -> None:
    """Run `req` until it finishes (RequestRejected when the engine cannot take it)."""
    async with contextlib.aclosing(run_request(svc, req, stream=False)) as run:
        async for _ in run:
            pass
