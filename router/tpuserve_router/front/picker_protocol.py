"""The Endpoint Picker protocol's vocabulary (`picker`): the metadata and header names a gateway
reads and writes, the limits a stream is held to, how a stream is refused (`StreamRefused`)
or a request answered by the picker (`Refused`), a pick (`Pick`), and the ext_proc messages
that carry a body."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Final

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from tpuserve_router.pipeline.ledger import Spend
from tpuserve_router.pipeline.request_body import ClientError
from tpuserve_router.pipeline.request_ids import Restorer
from tpuserve_router.pipeline.selection import Single
from tpuserve_router.pipeline.stages import Admitted
from tpuserve_router.policies.base import Decision
from tpuserve_router.tenancy.auth import ApiKey

if TYPE_CHECKING:
    from tpuserve_router.engines.workers import Worker


SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_KEY: Final = "x-gateway-destination-endpoint-subset"
DESTINATION_NAMESPACE: Final = "envoy.lb"
DESTINATION_KEY: Final = "x-gateway-destination-endpoint"
SERVED_KEY: Final = "x-gateway-destination-endpoint-served"
TEST_SELECTION_HEADER: Final = "test-epp-endpoint-selection"
TEST_SERVED_HEADER: Final = "x-conformance-test-served-endpoint"
CHUNK_BYTES: Final = 62_000
"""The most body bytes in one ``streamed_response`` (Envoy takes 64 KiB; the Inference
Extension's pickers keep this margin)."""
MAX_HEADER_BYTES: Final = 60 * 1024
"""The most bytes of request (or response) headers one stream may send, names and values:
Envoy's own limit (``max_request_headers_kb``, 60 KiB by default), so a gateway never sends
more; a stream that does is ended (``RESOURCE_EXHAUSTED``) and nothing of it kept."""
MAX_METADATA_BYTES: Final = 64 * 1024
"""The most bytes of a headers message beside its headers (the subset hint, attributes)."""


def endpoint_of(worker: Worker) -> str:
    """The ``ip:port`` a gateway dials for ``worker`` (``[v6]:port`` for IPv6)."""
    host = worker.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{worker.port}"


class StreamRefused(Exception):
    """A stream the picker ends with a gRPC status instead of answering it as a request: it
    broke the protocol, sent more than a gateway may, took too long, or has no credentials.
    ``reason`` is counted (``tpuserve_router_picker_streams_refused_total``)."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


class Refused(Exception):
    """A request the picker answers itself (an ``ImmediateResponse``)."""

    def __init__(self, error: ClientError, route: str, model: str = "") -> None:
        super().__init__(error.message)
        self.error = error
        self.route = route
        self.model = model


@dataclass(slots=True)
class Pick:
    """Where a request goes: the decision (None off the generation routes, which bypass the
    policy) and the endpoints in order, the chosen one first."""

    worker: Worker
    decision: Decision[Worker] | None
    endpoints: list[str]
    model: str
    route: str
    stream: bool
    arrived: float
    """When its stream started (its end-to-end latency runs from it)."""
    body: bytes | None = None
    """The body to pass on, with the router's own ``rid`` (None: the one received)."""
    restorer: Restorer | None = None
    """Writes the client's own ``rid`` back into the answer (None: it gave none)."""
    max_prompt_tokens: int = 0
    """The most prompt tokens the request can have cost (the answer's ``usage`` is capped)."""
    max_completion_tokens: int = 0
    """The most completion tokens it may generate, as its max-tokens fields and the workers'
    context allow."""
    admitted: Admitted | None = None
    """What the pipeline's admission let in (None off the generation routes)."""
    key: ApiKey | None = None
    """The API key it is charged to: none, the gateway authenticates its clients (a
    `ledger.Bill`, as the HTTP port's requests are)."""
    spend: Spend | None = None
    selection: Single | None = None
    """The driver's selection (None off the generation routes)."""
    answer_seconds: float = 0.0
    """How long the gateway is given to bring the answer's head back: what the HTTP port
    gives a worker for this request's first byte (`deadlines.FirstByteBudget`), so a pick the
    gateway never follows is released as soon as a working engine would have answered."""


KNOWN_STATUSES: Final = frozenset(str(status.value) for status in HTTPStatus)
OTHER_STATUS: Final = "other"
"""The status label of an answer whose ``:status`` is none of `KNOWN_STATUSES`: what the
stream says is the gateway's word, so it never makes a new series."""
TEMPLATE_TOKENS: Final = 4096
"""Tokens a chat template (or an engine's own framing) may add to a prompt, per generation,
beyond one token per character: part of the cap on an answer's ``usage``."""


WAITS: Final = {
    "headers": ("header_timeout_seconds", "--header-timeout", "header_timeout"),
    "body": ("body_timeout_seconds", "--body-timeout", "body_timeout"),
    "answer": ("first_byte_timeout_seconds", "--first-byte-timeout", "first_byte_timeout"),
    "answer_body": ("stream_idle_timeout_seconds", "--stream-idle-timeout", "idle_timeout"),
}
"""What a stream may wait for, with the setting (and its flag) bounding each wait and the
reason counted when it runs out: the request headers from the stream's start, the whole
request body from its headers, the answer from the pick, each next part of the answer from
the one before."""


def out_of_turn(kind: str | None, when: str) -> StreamRefused:
    return StreamRefused(
        grpc.StatusCode.INVALID_ARGUMENT,
        "protocol",
        f"{kind or 'an empty message'} {when}: one request per stream, its headers once, its "
        "body until it ends, its answer once an endpoint is chosen (the Endpoint Picker "
        "protocol)",
    )


def check_header_size(message: ext_proc.ProcessingRequest, headers: ext_proc.HttpHeaders) -> None:
    """Raise `StreamRefused` if ``headers`` hold more than `MAX_HEADER_BYTES` (names and
    values), or the message more than `MAX_METADATA_BYTES` beside them."""
    size = sum(len(h.key) + len(h.raw_value or h.value) for h in headers.headers.headers)
    if size > MAX_HEADER_BYTES:
        raise StreamRefused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "headers_too_large",
            f"the headers hold {size} bytes; the picker's limit is {MAX_HEADER_BYTES} "
            "(Envoy's max_request_headers_kb default)",
        )
    whole = message.ByteSize()
    if whole > size + MAX_METADATA_BYTES + len(headers.headers.headers) * 8:
        raise StreamRefused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "headers_too_large",
            f"the headers message holds {whole - size} bytes beside its headers (metadata, "
            f"attributes); the picker's limit is {MAX_METADATA_BYTES}",
        )


def subset_hint(context: base_pb2.Metadata) -> frozenset[str] | None:
    """The endpoints of the gateway's subset hint, or None when it gave none."""
    namespace = context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[SUBSET_KEY]
    items: Iterable[str]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values if v.HasField("string_value")]
    elif kind == "string_value":
        items = [value.string_value]
    else:
        items = []
    return frozenset(e.strip() for item in items for e in item.split(",") if e.strip())


def body_chunks(body: bytes) -> list[tuple[bytes, bool]]:
    """``body`` in pieces of at most `CHUNK_BYTES`, the last one marked (one empty piece for
    an empty body)."""
    if not body:
        return [(b"", True)]
    parts = [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)]
    return [(part, i == len(parts) - 1) for i, part in enumerate(parts)]


def request_chunk(body: bytes, end_of_stream: bool) -> ext_proc.ProcessingResponse:
    return ext_proc.ProcessingResponse(
        request_body=ext_proc.BodyResponse(
            response=ext_proc.CommonResponse(
                body_mutation=ext_proc.BodyMutation(
                    streamed_response=ext_proc.StreamedBodyResponse(
                        body=body, end_of_stream=end_of_stream
                    )
                )
            )
        )
    )
