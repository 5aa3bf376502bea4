"""What every generation route shares: a parsed request checked and turned into an engine
request, then run to completion (or streamed) with the client's disconnect as an abort.

As SGLang 0.5.23's tokenizer manager: a prompt of the context length or more is refused, and
so is a request whose prompt and asked-for new tokens exceed the context (400, SGLang's
message; a chat without ``max_tokens`` is not checked and stops at the context). A streamed
request is aborted when writing to its client fails; a non-streamed one when its client is
found gone, checked as the engine reports progress and, while it reports none (a queued
request), every `DISCONNECT_POLL_SECONDS` (SGLang's ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

from aiohttp import web

from sglang_tpu import disaggregation
from sglang_tpu.lora import adapter_problem, split_model
from sglang_tpu.sim.engine import ABORTED_WAITING, QueueFull
from sglang_tpu.sim.pd import PdFailure
from sglang_tpu.sim.protocol import AdapterRejected, GenerationRequest, InvalidRequest
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.responses import json_response, unavailable
from sglang_tpu.sim.service import EngineService

DISCONNECT_POLL_SECONDS = 4.0


def check_adapter(svc: EngineService, gen: GenerationRequest) -> None:
    """As SGLang: the adapter named in ``model`` (``BASE:ADAPTER``), else in ``lora_path``,
    must be loaded (``--lora-paths``); `AdapterRejected` with SGLang's message if not."""
    settings = svc.settings
    adapter = gen.lora_path
    if gen.model:
        adapter = split_model(gen.model, (settings.served_model_name,))[1] or adapter
    if adapter:
        loaded = [name for name, _ in settings.lora_paths]
        problem = adapter_problem(adapter, settings.enable_lora, loaded)
        if problem:
            raise AdapterRejected(None, problem)


class RequestRejected(Exception):
    """The engine cannot take the request now; `response` is the answer to send."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


def prepare(
    svc: EngineService, gen: GenerationRequest, prompt_ids: list[int], openai: bool
) -> Request:
    """Check the adapter, the prompt against the context length and vocabulary;
    InvalidRequest if not."""
    check_adapter(svc, gen)
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
    total = len(prompt_ids) + gen.max_new_tokens
    if gen.max_new_tokens_asked and total > ctx:
        raise InvalidRequest(
            None,
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {total} tokens: {len(prompt_ids)} tokens from the input "
            f"messages and {gen.max_new_tokens} tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit.",
        )
    max_new = min(gen.max_new_tokens, ctx - len(prompt_ids))
    pd_role = svc.pd
    if pd_role is not None:
        if gen.bootstrap is None and not pd_role.fake:
            raise InvalidRequest(None, disaggregation.NO_ROOM_MESSAGE.format(rid=gen.rid))
        if pd_role.settings.mode == "prefill":
            max_new = 1  # a prefill engine makes the first token; the decode engine the rest
    seed = gen.seed
    if seed is None and gen.temperature > 0:
        seed = svc.core.next_sampling_seed()
    req = Request(
        gen.rid or svc.new_rid(),
        prompt_ids,
        max_new,
        stop_strings=gen.stop,
        stop_token_ids=gen.stop_token_ids,
        sampling_seed=seed,
        stream=gen.stream,
    )
    req.bootstrap = gen.bootstrap
    return req


def pd_error(err: PdFailure) -> web.Response:
    """How a failed PD request is answered (SGLang aborts it with status 500)."""
    return json_response({"error": {"message": str(err)}}, status=err.status)


async def _pd_step(
    svc: EngineService,
    req: Request,
    work: Callable[[], Awaitable[None]],
    client_gone: Callable[[], bool] | None,
) -> bool:
    """Run one PD wait (`work`) so that ``/abort_request`` or the client leaving ends it;
    False when it was aborted (the request is finished as aborted)."""
    task = asyncio.ensure_future(work())
    svc.pd_waits[req.rid] = task
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if done:
                break
            if client_gone is not None and client_gone():
                task.cancel()
        if task.cancelled():
            req.finish_reason = dict(ABORTED_WAITING)
            req.finish_time = svc.now()
            return False
        task.result()  # PdFailure propagates
        return True
    finally:
        svc.pd_waits.pop(req.rid, None)
        if not task.done():
            task.cancel()


async def run_request(
    svc: EngineService,
    req: Request,
    stream: bool,
    client_gone: Callable[[], bool] | None = None,
) -> AsyncGenerator[int, None]:
    """Submit `req` and yield the output length each time it grows; aborts on disconnect
    (``client_gone`` is polled every `DISCONNECT_POLL_SECONDS` while nothing happens)."""
    wake = asyncio.Event()
    req.on_update = lambda _r: wake.set()
    if svc.draining:
        raise RequestRejected(unavailable("the server is draining"))
    pd_role = svc.pd
    boot = req.bootstrap
    arrived = svc.now()
    if pd_role is not None and pd_role.settings.mode == "decode":

        async def prealloc_then_receive() -> None:
            await _preallocated(svc, req)
            if boot is not None:
                await pd_role.receive(boot)

        try:
            received = await _pd_step(svc, req, prealloc_then_receive, client_gone)
        except PdFailure as err:
            raise RequestRejected(pd_error(err)) from None
        if not received:
            yield 0
            return
        svc.submit_transferred(req, arrived)
    else:
        try:
            svc.submit(req)
        except QueueFull as err:
            raise RequestRejected(unavailable(str(err))) from None
    try:
        sent = 0
        interval = svc.settings.stream_interval
        while not req.finished:
            if client_gone is None:
                await wake.wait()
            else:  # checked when the engine reports progress, or after a quiet poll period
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), DISCONNECT_POLL_SECONDS)
                if client_gone():
                    return  # the finally aborts it
            wake.clear()
            grown = len(req.output_ids) - sent  # 0 after a chunked-prefill step
            if stream and not req.finished and grown > 0 and (sent == 0 or grown >= interval):
                sent = len(req.output_ids)  # the first token at once, then every `interval`
                yield sent
        if (
            pd_role is not None and pd_role.settings.mode == "prefill" and boot is not None
            and req.finish_reason is not None and req.finish_reason.get("type") != "abort"
        ):  # fmt: skip
            waited = svc.now() - req.arrival_time
            try:
                await _pd_step(
                    svc, req, lambda: pd_role.send(boot, len(req.input_ids), waited), client_gone
                )
            except PdFailure as err:
                raise RequestRejected(pd_error(err)) from None
        yield len(req.output_ids)  # the finished state, once
    finally:
        if not req.finished:
            svc.core.abort(req, svc.now())


async def _preallocated(svc: EngineService, req: Request) -> None:
    """SGLang's decode prealloc queue: wait until the pool has room for the prompt's KV plus
    `RESERVED_DECODE_TOKENS` for it and each running request (PdFailure after the bootstrap
    timeout)."""
    pd_role = svc.pd
    assert pd_role is not None
    core = svc.core
    need = len(req.input_ids)

    def room() -> bool:
        reserved = disaggregation.RESERVED_DECODE_TOKENS * (core.num_running + 1)
        return core.config.cache_tokens - core.num_used_tokens - reserved >= need

    if room():
        return
    pd_role.queued_for_room(1)
    try:
        async with asyncio.timeout(pd_role.bootstrap_timeout), svc.stepped:
            await svc.stepped.wait_for(room)
    except TimeoutError:
        raise PdFailure(
            "bootstrap", f"no KV room for {need} tokens within {pd_role.bootstrap_timeout:g} s"
        ) from None
    finally:
        pd_role.queued_for_room(-1)


async def run_to_end(svc: EngineService, req: Request, request: web.Request | None = None) -> None:
    """Run `req` until it finishes or its client (``request``, if any) is gone
    (RequestRejected when the engine cannot take it)."""
    client_gone: Callable[[], bool] | None = None
    if request is not None:
        transport = request.transport

        def client_gone() -> bool:
            return transport is None or transport.is_closing()

    async with contextlib.aclosing(run_request(svc, req, False, client_gone)) as run:
        async for _ in run:
            pass
