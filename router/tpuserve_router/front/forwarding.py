"""The HTTP port's generation routes: a request becomes an `Arrival` handed to the driver
(`tpuserve_router.pipeline.driver.Driver.serve`), which walks it through the pipeline's stages
(admit, select a worker or a pair, relay, account) and answers it; a refusal of any stage is
answered here as an HTTP error (its status, its headers, an OpenAI-style JSON body) and
counted in the ledger."""

from __future__ import annotations

import functools

from tpuserve_router.front.http_request import Handler, HttpRequest
from tpuserve_router.pipeline.client import reply_error
from tpuserve_router.pipeline.driver import Driver
from tpuserve_router.pipeline.request_body import Parser
from tpuserve_router.pipeline.stages import Arrival, Refused


class Forwarder:
    """The HTTP port's front of the driver; one per router."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def handler(self, route: str, parser: Parser) -> Handler:
        """The handler of one generation route (``parser`` reads its body)."""
        return functools.partial(self.generate, route=route, parser=parser)

    async def generate(self, request: HttpRequest, route: str, parser: Parser) -> None:
        arrival = Arrival(
            route, parser, request.body, request.arrived, request.headers,
            client=request.peer_host, size=request.charged,
        )  # fmt: skip
        try:
            await self.driver.serve(arrival, request)
        except Refused as refused:
            request.extra_headers = arrival.reply_headers
            reply_error(request, refused.error)
            self.driver.refused(route, refused)
