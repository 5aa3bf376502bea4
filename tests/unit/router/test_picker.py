"""The endpoint picker's stream handling (`picker_exchange.Exchange`), message by message, on a
router that is built but not started (workers added by hand), and its settings' checks."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf import struct_pb2
from prometheus_client import CollectorRegistry

from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import ConfigError, RouterConfig
from tpuserve_router.engines.workers import WorkerSpec
from tpuserve_router.front import picker_protocol as protocol
from tpuserve_router.front.picker_exchange import Exchange
from tpuserve_router.metrics import PICKER_STREAM_REFUSAL_REASONS
from tpuserve_router.validation import validate

pytestmark = pytest.mark.unit

MODEL = "m"
URLS = ("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.2:8001")
ENDPOINTS = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8001")


def make_app(**settings: object) -> RouterApp:
    values: dict[str, object] = {
        "policy": "round_robin",
        "picker_port": 0,
        "max_request_bytes": 4096,
        **settings,
    }
    config = RouterConfig(**values)  # type: ignore[arg-type]
    app = create_router_app(config, registry=CollectorRegistry())
    for url in URLS:
        app.registry.add(WorkerSpec(url, model=MODEL)).health_check_passed(1)
    return app


@pytest.fixture
def app() -> RouterApp:
    return make_app()


def picks(app: RouterApp) -> int:
    """The picker's requests in flight (its own share, apart from the HTTP port's)."""
    assert app.picker is not None
    return app.picker.share.count


def exchange(app: RouterApp) -> Exchange:
    assert app.picker is not None
    return Exchange(app.picker)


def headers_message(
    path: str = "/v1/completions",
    *,
    end: bool = False,
    extra: dict[str, str] | None = None,
    subset: object = None,
) -> ext_proc.ProcessingRequest:
    pairs = {":method": "POST", ":path": path, **(extra or {})}
    message = ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()
                ]
            ),
            end_of_stream=end,
        )
    )
    if subset is not None:
        inner = struct_pb2.Struct()
        inner.update({protocol.SUBSET_KEY: subset})
        message.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].CopyFrom(inner)
    return message


def body_message(body: bytes, end: bool = True) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=body, end_of_stream=end))


def served(endpoint: str) -> base_pb2.Metadata:
    inner = struct_pb2.Struct()
    inner.update({protocol.SERVED_KEY: endpoint})
    metadata = base_pb2.Metadata()
    metadata.filter_metadata[protocol.DESTINATION_NAMESPACE].CopyFrom(inner)
    return metadata


def response_headers(status: int, endpoint: str) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(
        response_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())]
            )
        ),
        metadata_context=served(endpoint),
    )


def response_body(body: bytes, end: bool) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=body, end_of_stream=end))


BODY = orjson.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2})
ANSWER = orjson.dumps(
    {
        "choices": [{"text": "hi"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
)


def destination(replies: list[ext_proc.ProcessingResponse]) -> tuple[str, str]:
    """The header and the metadata destination of a headers reply."""
    reply = replies[0]
    assert reply.WhichOneof("response") == "request_headers"
    common = reply.request_headers.response
    assert common.clear_route_cache
    (option,) = common.header_mutation.set_headers
    assert option.header.key == protocol.DESTINATION_KEY
    lb = reply.dynamic_metadata.fields[protocol.DESTINATION_NAMESPACE].struct_value
    return option.header.raw_value.decode(), lb.fields[protocol.DESTINATION_KEY].string_value


def requests_total(
    app: RouterApp, worker: str, status: str, route: str = "/v1/completions"
) -> float:
    labels = {"model": MODEL, "worker": worker, "route": route, "status": status}
    return app.metrics.registry.get_sample_value("tpuserve_router_requests_total", labels) or 0.0


def test_a_request_is_picked_at_its_body_end_and_its_body_passed_on(app: RouterApp) -> None:
    ex = exchange(app)
    assert ex.handle(headers_message()) == []
    assert ex.handle(body_message(BODY[:10], end=False)) == []  # buffered until its end
    replies = ex.handle(body_message(BODY[10:]))
    header, metadata = destination(replies)
    assert header == metadata
    endpoints = header.split(",")
    assert len(endpoints) == 3
    assert set(endpoints) == set(ENDPOINTS)
    (body_reply,) = replies[1:]
    streamed = body_reply.request_body.response.body_mutation.streamed_response
    assert streamed.end_of_stream
    forwarded = orjson.loads(streamed.body)  # the router's own rid added, the rest as sent
    assert len(forwarded.pop("rid")) == 32
    assert forwarded == orjson.loads(BODY)
    chosen = app.registry.get(f"http://{endpoints[0]}")
    assert chosen is not None
    assert chosen.in_flight == 1
    assert picks(app) == 1
    # the answer: headers, then the body, echoed back chunk by chunk
    (reply,) = ex.handle(response_headers(200, endpoints[0]))
    assert reply.WhichOneof("response") == "response_headers"
    for piece, last in ((ANSWER[:7], False), (ANSWER[7:], True)):
        (reply,) = ex.handle(response_body(piece, last))
        echoed = reply.response_body.response.body_mutation.streamed_response
        assert (echoed.body, echoed.end_of_stream) == (piece, last)
    assert ex.closed
    assert chosen.in_flight == 0
    assert picks(app) == 0
    assert requests_total(app, chosen.name, "200") == 1
    tokens = {"model": MODEL, "worker": chosen.name}
    assert (
        app.metrics.registry.get_sample_value("tpuserve_router_completion_tokens_total", tokens)
        == 2
    )
    ex.close()  # after the end: nothing counted twice
    assert requests_total(app, chosen.name, "200") == 1


def test_large_bodies_are_re_emitted_in_chunks_the_gateway_takes() -> None:
    app = make_app(max_request_bytes=1 << 20)
    ex = exchange(app)
    ex.handle(headers_message())
    big = orjson.dumps({"model": MODEL, "prompt": "x" * 150_000})
    replies = ex.handle(body_message(big))
    pieces = [r.request_body.response.body_mutation.streamed_response for r in replies[1:]]
    joined = b"".join(p.body for p in pieces)
    assert [len(p.body) for p in pieces] == [
        protocol.CHUNK_BYTES,
        protocol.CHUNK_BYTES,
        len(joined) - 124_000,
    ]
    assert [p.end_of_stream for p in pieces] == [False, False, True]
    forwarded = orjson.loads(joined)
    del forwarded["rid"]
    assert forwarded == orjson.loads(big)


@pytest.mark.parametrize(
    ("subset", "allowed"),
    [
        ([ENDPOINTS[1]], {ENDPOINTS[1]}),
        (f"{ENDPOINTS[0]}, {ENDPOINTS[2]}", {ENDPOINTS[0], ENDPOINTS[2]}),
        (["10.0.0.2"], {ENDPOINTS[1], ENDPOINTS[2]}),  # an address alone: all its ports
    ],
)
def test_the_subset_hint_limits_primary_and_fallbacks(
    app: RouterApp, subset: object, allowed: set[str]
) -> None:
    for _ in range(3):
        ex = exchange(app)
        ex.handle(headers_message(subset=subset))
        header, _ = destination(ex.handle(body_message(BODY)))
        assert set(header.split(",")) == allowed
        ex.close()


@pytest.mark.parametrize("subset", [["10.9.9.9:1"], []], ids=["unknown", "empty"])
def test_nothing_eligible_in_the_subset_is_503(app: RouterApp, subset: object) -> None:
    ex = exchange(app)
    ex.handle(headers_message(subset=subset))
    (reply,) = ex.handle(body_message(BODY))
    immediate = reply.immediate_response
    assert immediate.status.code == 503
    assert b"none of the endpoints" in immediate.body
    assert {h.header.key for h in immediate.headers.set_headers} >= {"retry-after"}
    assert ex.closed
    assert picks(app) == 0


def test_no_healthy_worker_is_503(app: RouterApp) -> None:
    for worker in app.registry.workers:
        worker.health_check_failed(1)
    ex = exchange(app)
    ex.handle(headers_message())
    (reply,) = ex.handle(body_message(BODY))
    assert reply.immediate_response.status.code == 503
    assert b"no healthy worker" in reply.immediate_response.body


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{nope", 400, b"JSON"),
        (orjson.dumps({"model": "other", "prompt": "x"}), 404, b"available: m"),
        (orjson.dumps({"model": MODEL, "prompt": 5}), 400, b"prompt"),
    ],
)
def test_bad_requests_get_the_http_modes_answer(
    app: RouterApp, body: bytes, status: int, words: bytes
) -> None:
    ex = exchange(app)
    ex.handle(headers_message())
    (reply,) = ex.handle(body_message(body))
    assert reply.immediate_response.status.code == status
    assert words in reply.immediate_response.body
    labels = {"model": "", "worker": "none", "route": "/v1/completions", "status": str(status)}
    assert app.metrics.registry.get_sample_value("tpuserve_router_requests_total", labels) == 1


def test_a_body_over_the_limit_is_413_and_its_buffer_released(app: RouterApp) -> None:
    assert app.picker is not None
    ex = exchange(app)
    ex.handle(headers_message())
    assert ex.handle(body_message(b"x" * 3000, end=False)) == []
    assert app.picker.buffered == 3000
    assert app.picker.buffers.used == 3000  # its own budget, not the HTTP front's
    assert app.book.buffers.used == 0
    (reply,) = ex.handle(body_message(b"x" * 3000, end=False))
    assert reply.immediate_response.status.code == 413
    assert b"--max-request-bytes" in reply.immediate_response.body
    assert app.picker.buffered == 0
    assert app.picker.buffers.used == 0
    assert ex.closed


def test_a_short_token_file_is_refused_naming_what_is_allowed(tmp_path: Path) -> None:
    short = tmp_path / "token"
    short.write_text("too short\n")
    with pytest.raises(ConfigError) as caught:
        validate(RouterConfig(picker_port=0, picker_token_file=str(short)))
    assert any("allowed: 16 to 4096 printable" in p for p in caught.value.problems)


def test_the_picker_and_the_http_front_each_have_their_own_buffer_budget() -> None:
    """Issue 68: one budget let half-sent picker bodies lock the HTTP port out (503). The
    picker's share is carved out of --max-buffered-bytes; either front full leaves the other
    its whole share."""
    app = make_app(max_request_bytes=4096, max_buffered_bytes=12_000)
    assert app.picker is not None
    assert app.picker.buffers.max_bytes == 4096  # a quarter, at least one body
    assert app.book.buffers.max_bytes == 12_000 - 4096
    assert app.book.buffers.take(7000)  # HTTP bodies being read: its budget almost full
    ex = exchange(app)
    ex.handle(headers_message())
    assert ex.handle(body_message(b"x" * 3000, end=False)) == []  # the picker's room is whole
    other = exchange(app)
    other.handle(headers_message())
    (reply,) = other.handle(body_message(b"x" * 2000, end=False))
    assert reply.immediate_response.status.code == 503
    assert b"--picker-max-buffered-bytes" in reply.immediate_response.body
    assert app.picker.buffers.used == 3000
    assert app.book.buffers.used == 7000
    assert app.book.buffers.free >= 900  # what the HTTP port had is still its own


@pytest.mark.parametrize(
    "second",
    [
        headers_message("/v1/models", end=True),
        body_message(BODY),
        ext_proc.ProcessingRequest(request_trailers=ext_proc.HttpTrailers()),
    ],
    ids=["headers", "body", "trailers"],
)
def test_a_message_after_the_pick_is_a_protocol_error_not_a_second_pick(
    app: RouterApp, second: ext_proc.ProcessingRequest
) -> None:
    ex = exchange(app)
    ex.handle(headers_message())
    destination(ex.handle(body_message(BODY)))
    assert picks(app) == 1
    if second.WhichOneof("request") == "request_trailers":
        (reply,) = ex.handle(second)  # trailers are answered; no second decision
        assert reply.WhichOneof("response") == "request_trailers"
    else:
        with pytest.raises(protocol.StreamRefused) as caught:
            ex.handle(second)
        assert caught.value.reason == "protocol"
    assert picks(app) == 1
    assert sum(w.in_flight for w in app.registry.workers) == 1
    ex.close()
    assert picks(app) == 0
    assert all(w.in_flight == 0 for w in app.registry.workers)


def test_answer_messages_before_the_pick_are_protocol_errors(app: RouterApp) -> None:
    ex = exchange(app)
    with pytest.raises(protocol.StreamRefused):
        ex.handle(body_message(BODY))  # before the headers
    ex = exchange(app)
    ex.handle(headers_message())
    with pytest.raises(protocol.StreamRefused):
        ex.handle(response_headers(200, ENDPOINTS[0]))


def test_at_max_in_flight_the_request_is_shed_with_429() -> None:
    app = make_app(max_in_flight=1)
    first = exchange(app)
    first.handle(headers_message())
    destination(first.handle(body_message(BODY)))
    second = exchange(app)
    second.handle(headers_message())
    (reply,) = second.handle(body_message(BODY))
    assert reply.immediate_response.status.code == 429
    first.close()  # the gateway's stream ended before the answer: 499, nothing left booked
    assert picks(app) == 0
    assert sum(requests_total(app, u, "499") for u in URLS) == 1
    assert all(w.in_flight == 0 for w in app.registry.workers)


def test_a_fallback_that_served_moves_the_in_flight_count_and_the_accounting(
    app: RouterApp,
) -> None:
    ex = exchange(app)
    ex.handle(headers_message())
    header, _ = destination(ex.handle(body_message(BODY)))
    primary, fallback = header.split(",")[:2]
    ex.handle(response_headers(200, fallback))
    assert app.registry.get(f"http://{primary}").in_flight == 0  # type: ignore[union-attr]
    assert app.registry.get(f"http://{fallback}").in_flight == 1  # type: ignore[union-attr]
    ex.handle(response_body(ANSWER, True))
    assert requests_total(app, f"http://{fallback}", "200") == 1
    assert requests_total(app, f"http://{primary}", "200") == 0
    assert all(w.in_flight == 0 for w in app.registry.workers)


def test_bodiless_requests_are_picked_on_their_headers_without_the_policy(app: RouterApp) -> None:
    ex = exchange(app)
    replies = ex.handle(headers_message("/v1/models", end=True))
    assert len(replies) == 1  # the headers reply alone: no body to pass on
    header, metadata = destination(replies)
    assert header == metadata
    assert header.split(",")[0] in ENDPOINTS
    ex.handle(response_headers(200, header.split(",")[0]))
    ex.handle(response_body(b"{}", True))
    assert picks(app) == 0
    assert all(w.in_flight == 0 for w in app.registry.workers)


def test_request_trailers_end_the_body() -> None:
    app = make_app()
    ex = exchange(app)
    ex.handle(headers_message())
    ex.handle(body_message(BODY, end=False))
    replies = ex.handle(ext_proc.ProcessingRequest(request_trailers=ext_proc.HttpTrailers()))
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "request_trailers"]
    ex.close()


def test_the_test_headers_steer_and_echo_only_when_asked() -> None:
    steering = {protocol.TEST_SELECTION_HEADER: ENDPOINTS[2]}
    for enabled in (True, False):
        app = make_app(picker_test_headers=enabled)
        chosen = set()
        for _ in range(3):
            ex = exchange(app)
            ex.handle(headers_message(extra=steering))
            header, _ = destination(ex.handle(body_message(BODY)))
            chosen.add(header.split(",")[0])
            (reply,) = ex.handle(response_headers(200, header.split(",")[0]))
            echoed = {
                h.header.key: h.header.raw_value.decode()
                for h in reply.response_headers.response.header_mutation.set_headers
            }
            assert echoed.get(protocol.TEST_SERVED_HEADER) == (
                header.split(",")[0] if enabled else None
            )
            ex.close()
        assert (chosen == {ENDPOINTS[2]}) is enabled


def test_ipv6_endpoints_are_bracketed() -> None:
    app = create_router_app(RouterConfig(picker_port=0), registry=CollectorRegistry())
    worker = app.registry.add(WorkerSpec("http://[fd00::1]:8000", model=MODEL))
    assert protocol.endpoint_of(worker) == "[fd00::1]:8000"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"picker_port": 8000}, "picker_port=8000: must differ"),
        ({"picker_port": 9100, "metrics_port": 9100}, "picker_port=9100: must differ"),
        ({"picker_port": 8101, "peer_port": 8100}, "picker_port=8101: must differ"),
        ({"picker_port": 70000}, "picker_port=70000: allowed 0..65535"),
        ({"picker_test_headers": True}, "picker_test_headers=True: needs picker_port"),
        ({"picker_tls": True}, "picker_tls=True: needs picker_port"),
        ({"picker_token_file": "/etc/hosts"}, "picker_token_file='/etc/hosts': needs picker_port"),
        ({"picker_port": 0, "picker_token_file": "/nonexistent"}, "'/nonexistent': cannot be read"),
        ({"picker_port": 0, "picker_max_connections": 0}, "picker_max_connections=0: allowed 1.."),
        (
            {"picker_port": 0, "picker_max_message_bytes": 1000},
            "picker_max_message_bytes=1000: allowed 131072..",
        ),
    ],
)
def test_picker_settings_are_checked(settings: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(RouterConfig(**settings))  # type: ignore[arg-type]
    assert any(words in problem for problem in caught.value.problems), caught.value.problems


def test_every_way_a_stream_ends_early_has_its_metric_label() -> None:
    reasons = {reason for _, _, reason in protocol.WAITS.values()}
    reasons |= {"unauthenticated", "protocol", "headers_too_large"}
    assert reasons == set(PICKER_STREAM_REFUSAL_REASONS)


def answered(app: RouterApp, status: object, answer: bytes) -> Exchange:
    """One request picked and answered through the stream with ``status`` and ``answer``."""
    ex = exchange(app)
    ex.handle(headers_message())
    header, _ = destination(ex.handle(body_message(BODY)))
    message = response_headers(200, header.split(",")[0])
    message.response_headers.headers.headers[0].raw_value = str(status).encode()
    ex.handle(message)
    ex.handle(response_body(answer, True))
    return ex


def status_labels(app: RouterApp) -> set[str]:
    return {
        sample.labels["status"]
        for family in app.metrics.registry.collect()
        if family.name == "tpuserve_router_requests"
        for sample in family.samples
    }


def test_forged_statuses_make_no_new_series(app: RouterApp) -> None:
    for i in range(50):
        answered(app, f"9{i:02d}", ANSWER)
        answered(app, f"forged-{i}", ANSWER)
    labels = status_labels(app)
    assert len(labels) <= 2, labels  # every forged one under one label


def test_5xx_read_from_the_stream_ejects_no_worker(app: RouterApp) -> None:
    """Only the router's own observations (health checks) eject: the answer side of a stream
    is the gateway's word, which a forged stream could use to eject a chosen worker."""
    for _ in range(3 * app.config.outlier_consecutive_failures):
        answered(app, 503, b'{"error": "forged"}')
    assert all(w.consecutive_failures == 0 for w in app.registry.workers)
    assert all(w.ejected_until == 0.0 for w in app.registry.workers)
    assert sum(requests_total(app, w.name, "503") for w in app.registry.workers) == 15


def test_5xx_from_an_authenticated_gateway_ejects_the_worker(tmp_path: Path) -> None:
    """With ``--picker-token-file`` every stream is the gateway's: its statuses are what it saw
    of the engine, and a worker that keeps answering 5xx is ejected as on the HTTP port."""
    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789abcdef\n")
    app = make_app(picker_token_file=str(token))
    for _ in range(3 * app.config.outlier_consecutive_failures):
        answered(app, 503, b'{"error": "engine failure"}')
    assert any(w.ejected_until > 0.0 for w in app.registry.workers)


def test_usage_from_the_stream_is_bounded_by_the_request(app: RouterApp) -> None:
    forged = orjson.dumps(
        {"usage": {"prompt_tokens": 10**18, "completion_tokens": 10**18,
                   "prompt_tokens_details": {"cached_tokens": 10**18}}}
    )  # fmt: skip
    answered(app, 200, forged)
    totals = {
        name: sum(
            app.metrics.registry.get_sample_value(name, {"model": MODEL, "worker": w.name}) or 0
            for w in app.registry.workers
        )
        for name in (
            "tpuserve_router_prompt_tokens_total",
            "tpuserve_router_completion_tokens_total",
            "tpuserve_router_cached_tokens_total",
        )
    }
    assert totals["tpuserve_router_completion_tokens_total"] <= 2  # max_tokens
    assert 0 < totals["tpuserve_router_prompt_tokens_total"] < 10_000  # a 5-character prompt
    assert (
        totals["tpuserve_router_cached_tokens_total"]
        <= totals["tpuserve_router_prompt_tokens_total"]
    )


def test_the_clients_rid_is_replaced_in_the_body_and_restored_in_the_answer(
    app: RouterApp,
) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2, "rid": "mine"})
    ex = exchange(app)
    ex.handle(headers_message(extra={"content-length": str(len(body))}))
    replies = ex.handle(body_message(body))
    forwarded = b"".join(
        r.request_body.response.body_mutation.streamed_response.body for r in replies[1:]
    )
    ours = orjson.loads(forwarded)["rid"]
    assert ours != "mine"
    assert len(ours) == 32
    set_headers = {
        o.header.key: o.header.raw_value
        for o in replies[0].request_headers.response.header_mutation.set_headers
    }
    assert set_headers["content-length"] == str(len(forwarded)).encode()
    chosen = set_headers[protocol.DESTINATION_KEY].decode().split(",")[0]
    (reply,) = ex.handle(response_headers(200, chosen))
    assert "content-length" in reply.response_headers.response.header_mutation.remove_headers
    echoed = orjson.dumps({"id": ours, "choices": [{"text": "hi"}]})
    first, second = echoed[:12], echoed[12:]  # the id split across two chunks
    out = [ex.handle(response_body(first, False)), ex.handle(response_body(second, True))]
    answer = b"".join(
        r.response_body.response.body_mutation.streamed_response.body for rs in out for r in rs
    )
    assert orjson.loads(answer)["id"] == "mine"
