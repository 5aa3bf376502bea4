"""A minimal SGLang-compatible upstream for router benchmarks: answers at once, no model.

    python bench/router_stub.py PORT MODEL

``/v1/models`` lists MODEL; ``/v1/chat/completions`` streams four SSE chunks then
``[DONE]``; ``/generate`` and everything else answer one small JSON body with usage. It
isolates the router's own cost and latency from an engine's (it is not an engine twin:
no cache, no batching, no KV events). Loopback only.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

from tpuserve_router.config import RouterConfig
from tpuserve_router.front.http_request import Handler, HttpRequest
from tpuserve_router.front.server import front_limits, serve

JSON = b"content-type: application/json\r\n"
SSE = b"content-type: text/event-stream\r\n"
USAGE = (
    b'"usage":{"prompt_tokens":500,"completion_tokens":8,'
    b'"prompt_tokens_details":{"cached_tokens":0}}'
)
COMPLETION = (
    b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":" a b c d e f g h",'
    b'"finish_reason":"length"}],' + USAGE + b"}"
)
GENERATE = (
    b'{"text":" a","output_ids":[5],"meta_info":{"prompt_tokens":500,'
    b'"completion_tokens":1,"cached_tokens":0,"finish_reason":{"type":"length"}}}'
)
EVENT = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":" a"}}]}\n\n'
)


def make_handler(model: str) -> Handler:
    models = b'{"object":"list","data":[{"id":"%s","object":"model"}]}' % model.encode()

    async def handle(request: HttpRequest) -> None:
        if request.path == "/v1/models":
            request.respond(200, JSON, models)
        elif request.path == "/v1/chat/completions":
            request.start_chunked(200, SSE)
            for _ in range(4):
                request.write_chunk(EVENT)
                await asyncio.sleep(0)
            request.write_chunk(b"data: [DONE]\n\n")
            request.end_chunked()
        elif request.path == "/generate":
            request.respond(200, JSON, GENERATE)
        else:
            request.respond(200, JSON, COMPLETION)

    return handle


async def main(port: int, model: str) -> None:
    await serve(make_handler(model), "127.0.0.1", port, front_limits(RouterConfig()))
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2]))
