"""One ext_proc stream of the Endpoint Picker (`picker`): its request's headers and body
until the pick, the answer's headers and body passed back, and its end in the driver's ledger."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from tpuserve_router.front.connections import BufferBudget
from tpuserve_router.front.picker_protocol import (
    DESTINATION_KEY,
    DESTINATION_NAMESPACE,
    KNOWN_STATUSES,
    OTHER_STATUS,
    SERVED_KEY,
    TEST_SELECTION_HEADER,
    TEST_SERVED_HEADER,
    WAITS,
    Pick,
    Refused,
    StreamRefused,
    body_chunks,
    check_header_size,
    endpoint_of,
    out_of_turn,
    request_chunk,
    subset_hint,
)
from tpuserve_router.pipeline.driver import Driver
from tpuserve_router.pipeline.ledger import CLIENT_CLOSED, TryOutcome, Verdict
from tpuserve_router.pipeline.refusals import unavailable
from tpuserve_router.pipeline.request_body import GENERATION_ROUTES, ClientError
from tpuserve_router.pipeline.stages import InFlight
from tpuserve_router.pipeline.usage import TokenCounts, usage_from_body, usage_from_stream_tail

if TYPE_CHECKING:
    from tpuserve_router.config import RouterConfig
    from tpuserve_router.engines.workers import Worker
    from tpuserve_router.pipeline.ledger import Ledger
    from tpuserve_router.pipeline.stages import Pipeline


class Picker(Protocol):
    """What a stream reads of the picker that serves it (`picker.EndpointPicker`)."""

    config: RouterConfig
    driver: Driver
    pipeline: Pipeline
    ledger: Ledger
    share: InFlight
    buffers: BufferBudget
    buffered: int
    """Request-body bytes the picker's streams hold (charged to `buffers` too)."""
    max_body_bytes: int
    test_headers: bool
    authenticated: bool

    def pick(
        self, path: str, body: bytes, allowed: frozenset[str] | None, arrived: float | None = None
    ) -> Pick: ...

    def worker_at(self, endpoint: str) -> Worker | None: ...


class Exchange:
    """One ext_proc stream: one HTTP request and its answer."""

    __slots__ = (
        "arrived",
        "body",
        "closed",
        "deadline",
        "first_chunk",
        "headers",
        "path",
        "pick",
        "picker",
        "requested",
        "served",
        "size",
        "status",
        "subset",
        "tail",
        "timed_out",
        "waiting",
    )

    def __init__(self, picker: Picker) -> None:
        self.picker = picker
        self.arrived = time.monotonic()
        self.headers: dict[str, str] = {}
        self.path = "/"
        self.subset: frozenset[str] | None = None
        self.body: list[bytes] = []
        self.size = 0  # bytes in body
        self.pick: Pick | None = None
        self.served: Worker | None = None
        self.status = CLIENT_CLOSED
        self.first_chunk = True
        self.tail = (b"", b"")
        self.closed = False
        self.requested = False  # its request headers arrived
        self.waiting = "headers"  # what the stream waits for: a key of `WAITS`
        self.deadline = self.arrived + picker.config.header_timeout_seconds
        self.timed_out: StreamRefused | None = None  # set by `expired`

    def _wait(self, what: str, now: float) -> None:
        self.waiting = what
        self.deadline = now + getattr(self.picker.config, WAITS[what][0])

    def expired(self, now: float) -> bool:
        """Whether the stream waited past its deadline for what it waits for; if so,
        ``timed_out`` says how it ends (the sweep, `EndpointPicker._tick`, cancels it)."""
        if now <= self.deadline:
            return False
        setting, flag, reason = WAITS[self.waiting]
        seconds = getattr(self.picker.config, setting)
        if self.waiting == "answer" and self.pick is not None:
            seconds = self.pick.answer_seconds  # derived from the request, at most the flag's
        what = self.waiting.replace("_", " ")
        self.timed_out = StreamRefused(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            reason,
            f"the stream's {what} did not arrive within {seconds:g} s ({flag})",
        )
        return True

    def handle(self, message: ext_proc.ProcessingRequest) -> list[ext_proc.ProcessingResponse]:
        """The replies to one message; raises `StreamRefused` for a message out of turn: one
        stream carries one request, its headers once, its body until decided, and the
        answer only once decided."""
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._request_headers(message)
        if not self.requested:
            raise out_of_turn(kind, "before the request headers")
        if kind == "request_body":
            return self._request_body(message.request_body)
        if kind == "request_trailers":  # the body ended without its end_of_stream
            replies = self._decide(body_ends=False) if self.pick is None and not self.closed else []
            trailers = ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
            return [*replies, trailers]
        if self.pick is None:
            raise out_of_turn(kind, "before the picker chose an endpoint")
        self._wait("answer_body", time.monotonic())
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_body":
            return self._response_body(message)
        if kind == "response_trailers":
            self._finish()
            return [ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())]
        return []

    # ------------------------------------------------------------------ request path

    def _request_headers(
        self, message: ext_proc.ProcessingRequest
    ) -> list[ext_proc.ProcessingResponse]:
        if self.requested:
            raise out_of_turn("request_headers", "again")
        self.requested = True
        headers = message.request_headers
        check_header_size(message, headers)
        for header in headers.headers.headers:
            value = header.raw_value.decode("latin-1") if header.raw_value else header.value
            self.headers[header.key.lower()] = value
        self.path = self.headers.get(":path", "/")
        self.subset = subset_hint(message.metadata_context)
        if self.picker.test_headers:
            selection = self.headers.get(TEST_SELECTION_HEADER, "")
            chosen = frozenset(e.strip() for e in selection.split(",") if e.strip())
            if chosen:
                self.subset = chosen
        if headers.end_of_stream:
            return self._decide(body_ends=None)
        self._wait("body", time.monotonic())
        return []

    def _request_body(self, chunk: ext_proc.HttpBody) -> list[ext_proc.ProcessingResponse]:
        picker = self.picker
        if self.pick is not None:
            raise out_of_turn("request_body", "after the request's body ended")
        size = len(chunk.body)
        if self.size + size > picker.max_body_bytes:
            return self._refuse(
                Refused(
                    ClientError(
                        413,
                        f"the request body is over {picker.max_body_bytes} bytes "
                        "(--max-request-bytes)",
                        error_type="invalid_request_error",
                    ),
                    self._route_label(),
                )
            )
        if size and not picker.buffers.take(size):
            budget = picker.buffers
            return self._refuse(
                Refused(
                    unavailable(
                        f"the picker holds {budget.used} bytes of requests, its limit is "
                        f"{budget.max_bytes} (--picker-max-buffered-bytes, its own share of "
                        "--max-buffered-bytes); retry"
                    ),
                    self._route_label(),
                )
            )
        if size:
            self.body.append(chunk.body)
            self.size += size
            picker.buffered += size
        if chunk.end_of_stream:
            return self._decide(body_ends=True)
        return []

    def _route_label(self) -> str:
        route = self.path.partition("?")[0]
        return route if route in GENERATION_ROUTES else "other"

    def _decide(self, body_ends: bool | None) -> list[ext_proc.ProcessingResponse]:
        """Choose the worker and reply: the headers, then the body buffered so far, its last
        piece marked ``body_ends`` (None: the request had no body, so none is sent)."""
        body = b"".join(self.body)
        self._release_body()
        try:
            pick = self.picker.pick(self.path, body, self.subset, self.arrived)
        except Refused as refused:
            return self._refuse(refused)
        self._book(pick)
        destination = ",".join(pick.endpoints)
        mutation = ext_proc.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=DESTINATION_KEY, raw_value=destination.encode())
                )
            ]
        )
        if pick.body is not None and pick.body != body:
            body = pick.body
            if "content-length" in self.headers:  # the gateway would send the old length
                mutation.set_headers.append(
                    base_pb2.HeaderValueOption(
                        header=base_pb2.HeaderValue(
                            key="content-length", raw_value=str(len(body)).encode()
                        )
                    )
                )
        metadata = struct_pb2.Struct()
        metadata.update({DESTINATION_NAMESPACE: {DESTINATION_KEY: destination}})
        replies = [
            ext_proc.ProcessingResponse(
                request_headers=ext_proc.HeadersResponse(
                    response=ext_proc.CommonResponse(
                        clear_route_cache=True, header_mutation=mutation
                    )
                ),
                dynamic_metadata=metadata,
            )
        ]
        if body_ends is not None:
            replies += [request_chunk(part, last and body_ends) for part, last in body_chunks(body)]
        return replies

    def _book(self, pick: Pick) -> None:
        """The one place a pick is counted in flight (`_finish` the one it is taken back);
        an exchange makes one pick at most."""
        assert self.pick is None, "one pick per exchange"
        assert self.served is None, "one pick per exchange"
        self.pick = pick
        self.served = pick.worker
        if pick.selection is None:  # off the generation routes: counted here (`Driver.pick`)
            self.picker.ledger.counted((pick.worker,), 1)
            self.picker.pipeline.enter(None, self.picker.share)
        self.waiting = "answer"
        self.deadline = time.monotonic() + pick.answer_seconds

    def _refuse(self, refused: Refused) -> list[ext_proc.ProcessingResponse]:
        self._release_body()
        self.closed = True
        error = refused.error
        self.status = str(error.status)
        self.picker.ledger.refused(refused.route, refused.model, error.status)
        headers = [
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json")
            )
        ]
        headers += [
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1"))
            )
            for k, v in error.headers.items()
        ]
        return [
            ext_proc.ProcessingResponse(
                immediate_response=ext_proc.ImmediateResponse(
                    status=http_status_pb2.HttpStatus(code=error.status),
                    headers=ext_proc.HeaderMutation(set_headers=headers),
                    body=error.body(),
                    details=f"tpuserve picker: {error.message}"[:200],
                )
            )
        ]

    def _release_body(self) -> None:
        self.picker.buffered -= self.size
        self.picker.buffers.give(self.size)
        self.size = 0
        self.body = []

    # ------------------------------------------------------------------ response path

    def _response_headers(
        self, message: ext_proc.ProcessingRequest
    ) -> list[ext_proc.ProcessingResponse]:
        headers = message.response_headers
        check_header_size(message, headers)
        for header in headers.headers.headers:
            if header.key == ":status":
                status = header.raw_value.decode("latin-1") if header.raw_value else header.value
                self.status = status if status in KNOWN_STATUSES else OTHER_STATUS
        served = self._served_endpoint(message.metadata_context)
        mutation = ext_proc.HeaderMutation()
        if self.pick is not None and self.pick.restorer is not None:
            mutation.remove_headers.append("content-length")  # the client's ids change it
        if self.picker.test_headers:
            shown = served or (endpoint_of(self.served) if self.served is not None else "")
            mutation.set_headers.append(
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=TEST_SERVED_HEADER, raw_value=shown.encode())
                )
            )
        reply = ext_proc.ProcessingResponse(
            response_headers=ext_proc.HeadersResponse(
                response=ext_proc.CommonResponse(header_mutation=mutation)
            )
        )
        if headers.end_of_stream:
            self._finish()
        return [reply]

    def _served_endpoint(self, context: base_pb2.Metadata) -> str:
        """The endpoint the gateway says served the request (metadata), or ""; the request's
        in-flight count moves to it when it is a fallback."""
        namespace = context.filter_metadata.get(DESTINATION_NAMESPACE)
        if namespace is None or SERVED_KEY not in namespace.fields:
            return ""
        value = namespace.fields[SERVED_KEY]
        served = str(value.string_value).strip()
        pick = self.pick
        current = self.served
        if pick is None or current is None or not served or served == endpoint_of(current):
            return served
        worker = self.picker.worker_at(served)
        if worker is not None:
            ledger = self.picker.ledger
            ledger.counted((current,), -1)
            ledger.counted((worker,), 1)
            self.served = worker
        return served

    def _response_body(
        self, message: ext_proc.ProcessingRequest
    ) -> list[ext_proc.ProcessingResponse]:
        chunk = message.response_body
        if self.served is not None and self.pick is not None and self.first_chunk:
            self.first_chunk = False
            self._served_endpoint(message.metadata_context)
            pick = self.pick
            if pick.decision is not None:
                arrived = pick.arrived if pick.stream else None
                self.picker.ledger.first_byte(pick.decision, pick.model, arrived)
        if chunk.body:
            self.tail = (self.tail[1], chunk.body)
        passed = chunk.body
        restorer = self.pick.restorer if self.pick is not None else None
        if restorer is not None:
            passed = restorer.chunk(passed)
            if chunk.end_of_stream:
                passed += restorer.rest()
        reply = ext_proc.ProcessingResponse(
            response_body=ext_proc.BodyResponse(
                response=ext_proc.CommonResponse(
                    body_mutation=ext_proc.BodyMutation(
                        streamed_response=ext_proc.StreamedBodyResponse(
                            body=passed, end_of_stream=chunk.end_of_stream
                        )
                    )
                )
            )
        )
        if chunk.end_of_stream:
            self._finish()
        return [reply]

    # ------------------------------------------------------------------ the end

    def _finish(self) -> None:
        """The answer ended: account for it once, in the ledger every mode shares
        (`Ledger.account`, as `Forwarder._ended` does for the HTTP port's tries)."""
        pick, worker = self.pick, self.served
        self.closed = True
        if pick is None or worker is None:
            return
        self.pick = None
        picker = self.picker
        ledger = picker.ledger
        status = self.status
        code = int(status) if status.isdigit() else 0
        # Outlier detection hears the status only from a gateway that presented its token
        # (`--picker-token-file`): from anyone else it is a claim, not an observation (a
        # forged stream would eject the worker of its choice), and only the health checks eject.
        verdicts: tuple[Verdict, ...] = ()
        if picker.authenticated and status != CLIENT_CLOSED and code:
            failed = code >= 500
            verdicts = (Verdict(worker, "server_error" if failed else "", failed),)
        selection = pick.selection
        usage = None
        if selection is not None and code == 200:
            tail = self.tail[0] + self.tail[1]
            usage = usage_from_stream_tail(tail) if pick.stream else usage_from_body(tail)
            usage = None if usage is None else _bounded(usage, pick)
        outcome = TryOutcome(
            status=status, succeeded=0 < code < 400, relayed=status != CLIENT_CLOSED,
            usage=usage, verdicts=verdicts,
        )  # fmt: skip
        if selection is not None and pick.admitted is not None:
            picker.driver.close(pick, pick.admitted, selection, worker, pick.model, outcome)
            return
        # off the generation routes: no decision to tell the policy of
        picker.pipeline.leave(None, picker.share)
        ledger.counted((worker,), -1)
        if verdicts:
            ledger.worker_answered(worker, code)
        ledger.account(pick, worker.name, pick.model, outcome)

    def close(self) -> None:
        """The stream ended: whatever was not accounted for is (a gateway gone: ``499``)."""
        self._release_body()
        if self.pick is not None:
            self.status = CLIENT_CLOSED
            self._finish()


def _bounded(usage: TokenCounts, pick: Pick) -> TokenCounts:
    """``usage`` as the stream reported it, capped by what the request could cost: the answer
    side is the gateway's word, and one forged ``usage`` must not move the counters by 10¹⁸."""
    prompt, completion, cached = usage
    prompt = min(prompt, pick.max_prompt_tokens)
    return prompt, min(completion, pick.max_completion_tokens), min(cached, prompt)
