"""Evaluation events on the user's traces: the emitter against a real OTLP receiver on loopback.

Records are built by the real collector from an exchange that carried a ``traceparent``; the
events leave through the OpenTelemetry SDK's logs pipeline and its OTLP exporters (gRPC and
HTTP/protobuf) and are decoded by ``opentelemetry-proto`` on the other side, as a collector
would. Canary strings in the query, the context and the output must appear nowhere in the
bytes that arrive.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from semhealth.agent.errors import ConfigIssue
from semhealth.agent.otlp.evaluation import (
    ANSWER_RELEVANCE,
    CONTEXT_RELEVANCE,
    DEFAULT_THRESHOLD,
    ERROR_TYPE,
    EVALUATION_NAME,
    EVENT_NAME,
    EXPORT_FAILED,
    NOT_RELEVANT,
    OUTPUT_VALIDITY,
    QUEUE_FULL,
    RELEVANT,
    RESPONSE_ID,
    SCORE_LABEL,
    SCORE_VALUE,
    SHUTDOWN,
    EvaluationEmitter,
    EvaluationSettings,
    logs_endpoint,
    relevance_threshold,
    settings_from_config,
    validity_attributes,
)
from semhealth.alerts import load_rules
from semhealth.collectors import Config, Exchange, StreamCollector, StreamRecord, ValidityResult
from semhealth.embeddings import RelevanceScores
from tests.agent.otlp_receiver import GrpcReceiver, HttpReceiver, any_value, attributes

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"
CANARIES = ("CANARY-QUERY-7f3a", "CANARY-CONTEXT-91bd", "CANARY-OUTPUT-c04e")
QUERY, CONTEXT, OUTPUT = CANARIES


def sse(*contents: str) -> bytes:
    """An OpenAI chat stream whose deltas are ``contents``."""
    events = [
        {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}
        for text in contents
    ]
    events.append(
        {
            "id": "chatcmpl-1",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    body = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)
    return body + b"data: [DONE]\n\n"


def collect(
    *, traceparent: str | None = TRACEPARENT, output: Sequence[str] = ('{"answer": "', OUTPUT, '"}')
) -> StreamRecord:
    """A record as the tap builds it: a JSON-mode chat request with the canaries, streamed."""
    request = {
        "model": "m",
        "stream": True,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": CONTEXT},
            {"role": "user", "content": QUERY},
        ],
    }
    exchange = Exchange(
        method="POST",
        path="/v1/chat/completions",
        start_ns=1_000,
        status=200,
        content_type="text/event-stream",
        content_encoding=None,
        response_ns=2_000,
        request_body=orjson.dumps(request),
        traceparent=traceparent,
    )
    collector = StreamCollector(exchange, Config())
    collector.feed(sse(*output), 3_000)
    return collector.finish(4_000)


def scores(context: float | None, answer: float | None) -> RelevanceScores:
    return RelevanceScores(
        context=context, answer=answer, context_raw=context, answer_raw=answer, chunks=1
    )


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def evaluations(records: Sequence[LogRecord]) -> dict[str, dict[str, Any]]:
    """Each event's attributes, by evaluation name (one event per name in these tests)."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        attrs = dict(attributes(record.attributes))
        name = str(attrs[EVALUATION_NAME])
        assert name not in out, f"two {name} events"
        out[name] = attrs
    return out


@pytest.fixture(params=["grpc", "http/protobuf"])
async def receiver(request: pytest.FixtureRequest) -> AsyncIterator[GrpcReceiver | HttpReceiver]:
    server: GrpcReceiver | HttpReceiver = (
        GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    )
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown()


def settings_for(server: GrpcReceiver | HttpReceiver, **overrides: Any) -> EvaluationSettings:
    if isinstance(server, GrpcReceiver):
        endpoint, protocol = server.endpoint, "grpc"
    else:
        endpoint, protocol = server.url, "http/protobuf"  # the base URL: /v1/logs is added
    values: dict[str, Any] = {
        "enabled": True,
        "endpoint": endpoint,
        "protocol": protocol,
        "timeout_s": 2.0,
        "schedule_delay_s": 0.05,
        "resource_attributes": (("k8s.pod.name", "app-0"), ("k8s.namespace.name", "shop")),
        "headers": (("x-tenant", "team-a"),),
        **overrides,
    }
    return EvaluationSettings(**values)


# --------------------------------------------------------------------------- on the wire


async def test_judged_records_arrive_as_evaluation_events_on_their_span(
    receiver: GrpcReceiver | HttpReceiver,
) -> None:
    record = collect()
    assert record.trace is not None and record.validity  # the collector parsed and judged
    emitter = EvaluationEmitter(settings_for(receiver))
    emitter.start()
    emitter.consume_record(record)
    emitter.record_relevance(record, scores(context=0.91, answer=0.42))
    await emitter.shutdown(5.0)

    received = await receiver.wait_log_records(3)
    assert len(received) == 3
    for log_record in received:
        assert log_record.event_name == EVENT_NAME
        assert log_record.trace_id.hex() == TRACE_ID
        assert log_record.span_id.hex() == SPAN_ID
        assert log_record.time_unix_nano > 0
        assert log_record.severity_number == 9  # INFO
        assert log_record.body.WhichOneof("value") is None  # no body: the SDK sends it empty
    events = evaluations(received)
    assert events[CONTEXT_RELEVANCE] == {
        EVALUATION_NAME: CONTEXT_RELEVANCE,
        SCORE_VALUE: pytest.approx(0.91),
        SCORE_LABEL: RELEVANT,
    }
    assert events[ANSWER_RELEVANCE] == {
        EVALUATION_NAME: ANSWER_RELEVANCE,
        SCORE_VALUE: pytest.approx(0.42),
        SCORE_LABEL: NOT_RELEVANT,
    }
    assert events[OUTPUT_VALIDITY] == {
        EVALUATION_NAME: OUTPUT_VALIDITY,
        SCORE_VALUE: 1.0,
        SCORE_LABEL: "valid",
    }
    assert emitter.stats.emitted == emitter.stats.exported == 3
    assert emitter.stats.dropped == {}


async def test_events_carry_the_agents_resource_and_headers_and_no_text(
    receiver: GrpcReceiver | HttpReceiver,
) -> None:
    emitter = EvaluationEmitter(settings_for(receiver))
    emitter.start()
    record = collect()
    emitter.consume_record(record)
    emitter.record_relevance(record, scores(context=0.8, answer=0.8))
    await emitter.shutdown(5.0)
    await receiver.wait_log_records(3)

    (received,) = receiver.logs
    assert received.headers["x-tenant"] == "team-a"
    (resource_logs,) = received.request.resource_logs
    resource = dict(attributes(resource_logs.resource.attributes))
    assert resource["service.name"] == "semhealth"
    assert resource["k8s.pod.name"] == "app-0"
    assert resource["k8s.namespace.name"] == "shop"
    # Nothing of the traffic: not in any attribute, body or resource, not anywhere in the bytes.
    for canary in CANARIES:
        assert canary.encode() not in received.raw
    values = [any_value(kv.value) for r in receiver.log_records() for kv in r.attributes]
    assert not any(isinstance(v, str) and "CANARY" in v for v in values)
    assert "gen_ai.evaluation.explanation" not in {
        kv.key for r in receiver.log_records() for kv in r.attributes
    }


async def test_records_without_a_trace_emit_nothing(receiver: GrpcReceiver | HttpReceiver) -> None:
    emitter = EvaluationEmitter(settings_for(receiver))
    emitter.start()
    for traceparent in (None, "00-" + "0" * 32 + "-" + SPAN_ID + "-01", "not a traceparent"):
        untraced = collect(traceparent=traceparent)
        assert untraced.trace is None
        emitter.consume_record(untraced)
        emitter.record_relevance(untraced, scores(context=0.9, answer=0.9))
    traced = collect()
    emitter.consume_record(traced)  # the one event that may arrive
    await emitter.shutdown(5.0)

    (only,) = await receiver.wait_log_records(1)
    assert dict(attributes(only.attributes))[EVALUATION_NAME] == OUTPUT_VALIDITY
    assert emitter.stats.untraced == 3
    assert emitter.stats.emitted == emitter.stats.exported == 1


async def test_a_failed_output_is_labelled_with_its_failure_and_the_response_id_is_kept(
    receiver: GrpcReceiver | HttpReceiver,
) -> None:
    emitter = EvaluationEmitter(settings_for(receiver))
    emitter.start()
    broken = collect(output=("{", OUTPUT))  # JSON mode, but the output does not parse
    assert [result.result for result in broken.validity] == ["syntax"]
    emitter.consume_record(_with_response_id(broken, "chatcmpl-42"))
    await emitter.shutdown(5.0)

    (event,) = await receiver.wait_log_records(1)
    assert dict(attributes(event.attributes)) == {
        EVALUATION_NAME: OUTPUT_VALIDITY,
        SCORE_VALUE: 0.0,
        SCORE_LABEL: "syntax",
        RESPONSE_ID: "chatcmpl-42",
    }


def _with_response_id(record: StreamRecord, response_id: str) -> StreamRecord:
    return dataclasses.replace(record, response_id=response_id)


async def test_the_label_follows_the_configured_threshold(
    receiver: GrpcReceiver | HttpReceiver,
) -> None:
    emitter = EvaluationEmitter(settings_for(receiver, relevance_threshold=0.5))
    emitter.start()
    record = collect()
    emitter.record_relevance(record, scores(context=0.5, answer=0.49))
    await emitter.shutdown(5.0)

    events = evaluations(await receiver.wait_log_records(2))
    assert events[CONTEXT_RELEVANCE][SCORE_LABEL] == RELEVANT  # at the threshold: relevant
    assert events[ANSWER_RELEVANCE][SCORE_LABEL] == NOT_RELEVANT


# --------------------------------------------------------------------------- shedding


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_dead_endpoint_drops_and_counts_and_never_blocks(protocol: str) -> None:
    settings = EvaluationSettings(
        enabled=True,
        endpoint=f"http://127.0.0.1:{closed_port()}",
        protocol=protocol,
        timeout_s=0.5,
        max_queue_size=4,
        max_export_batch_size=4,
        schedule_delay_s=0.05,
    )
    emitter = EvaluationEmitter(settings)
    emitter.start()
    record = collect()
    total = 200
    for _ in range(total):
        emitter.consume_record(record)  # returns: emitting appends to a queue, or sheds
    stats = emitter.stats
    assert stats.emitted + stats.dropped.get(QUEUE_FULL, 0) == total
    assert stats.dropped.get(QUEUE_FULL, 0) > 0
    await emitter.shutdown(3.0)
    assert stats.exported == 0
    assert stats.pending == 0
    # Every event is counted once: refused by the dead endpoint, or still queued at shutdown.
    assert stats.dropped.get(EXPORT_FAILED, 0) + stats.dropped.get(SHUTDOWN, 0) == stats.emitted
    # And every event offered ends once: exported (none here) or dropped for one reason.
    assert stats.exported + stats.dropped_total == total


async def test_events_outside_start_and_shutdown_are_dropped_and_counted() -> None:
    settings = EvaluationSettings(enabled=True, endpoint=f"http://127.0.0.1:{closed_port()}")
    emitter = EvaluationEmitter(settings)
    record = collect()
    emitter.consume_record(record)  # before start
    await emitter.shutdown(1.0)  # without start: nothing to stop
    await emitter.shutdown(1.0)  # twice
    emitter.start()  # after shutdown: stays stopped
    emitter.consume_record(record)
    assert emitter.stats.dropped == {SHUTDOWN: 2}
    assert emitter.stats.emitted == 0


async def test_a_fresh_emitter_on_the_same_settings_starts_again(
    receiver: GrpcReceiver | HttpReceiver,
) -> None:
    settings = settings_for(receiver)
    for _ in range(2):
        emitter = EvaluationEmitter(settings)
        emitter.start()
        emitter.consume_record(collect())
        await emitter.shutdown(5.0)
        assert emitter.stats.exported == 1
    assert len(await receiver.wait_log_records(2)) == 2


# --------------------------------------------------------------------------- pure parts


def test_validity_is_valid_only_when_every_structured_output_is() -> None:
    valid, schema = ValidityResult("valid"), ValidityResult("schema", target="tool:lookup")
    assert validity_attributes([valid, valid], None) == {
        EVALUATION_NAME: OUTPUT_VALIDITY,
        SCORE_VALUE: 1.0,
        SCORE_LABEL: "valid",
    }
    assert validity_attributes([valid, schema, ValidityResult("truncated")], None) == {
        EVALUATION_NAME: OUTPUT_VALIDITY,
        SCORE_VALUE: 0.0,
        SCORE_LABEL: "schema",
    }
    assert validity_attributes([], None) is None


def test_a_schema_that_could_not_be_used_is_an_evaluation_error_not_a_verdict() -> None:
    unusable = ValidityResult("schema_error", reasons=("unsupported_dialect",))
    assert validity_attributes([unusable], "r-1") == {
        EVALUATION_NAME: OUTPUT_VALIDITY,
        ERROR_TYPE: "schema_error",
        RESPONSE_ID: "r-1",
    }
    # Beside a judged output, the judged one decides.
    assert validity_attributes([unusable, ValidityResult("valid")], None) == {
        EVALUATION_NAME: OUTPUT_VALIDITY,
        SCORE_VALUE: 1.0,
        SCORE_LABEL: "valid",
    }


def test_the_threshold_is_the_relevance_alerts_floor() -> None:
    assert relevance_threshold(load_rules()) == DEFAULT_THRESHOLD == 0.75
    lowered = load_rules(entries=[{"name": "ContextRelevanceLow", "threshold": 0.6}])
    assert relevance_threshold(lowered) == 0.6
    without = load_rules(entries=[{"name": "ContextRelevanceLow", "enabled": False}])
    assert relevance_threshold(without, default=0.7) == 0.7  # the regression rule has no floor


def test_settings_name_the_key_and_the_fix() -> None:
    issues = EvaluationSettings(enabled=True, protocol="udp", relevance_threshold=2.0).validate()
    paths = {issue.path for issue in issues}
    assert paths == {
        "otlp_receiver.evaluation.endpoint",
        "otlp_receiver.evaluation.protocol",
        "otlp_receiver.evaluation.relevance_threshold",
    }
    assert all(isinstance(issue, ConfigIssue) and issue.fix for issue in issues)
    with pytest.raises(ValueError, match=r"otlp_receiver\.evaluation\.endpoint"):
        EvaluationEmitter(EvaluationSettings(enabled=True))
    assert EvaluationSettings().validate() == []  # off, with no endpoint, is fine


def test_settings_from_a_config_block_keep_defaults_for_keys_it_lacks() -> None:
    class Block:
        enabled = True
        endpoint = "http://collector:4318"
        protocol = "http/protobuf"
        headers = {"authorization": "Bearer t"}

    settings = settings_from_config(
        Block(), resource_attributes=(("k8s.pod.name", "p"),), threshold=0.6
    )
    assert settings.enabled and settings.endpoint == "http://collector:4318"
    assert settings.headers == (("authorization", "Bearer t"),)
    assert settings.relevance_threshold == 0.6
    assert settings.timeout_s == EvaluationSettings().timeout_s
    assert settings.resource_attributes == (("k8s.pod.name", "p"),)


def test_without_an_endpoint_of_its_own_events_go_to_the_next_hop_as_it_is_configured() -> None:
    forward = SimpleNamespace(
        endpoint="https://next:4317",
        protocol="grpc",
        headers=(("authorization", "Bearer next"),),
        insecure=False,
        timeout_s=3.0,
    )
    via_forward = settings_from_config(
        SimpleNamespace(enabled=True, endpoint=None), forward=forward
    )
    assert (via_forward.endpoint, via_forward.protocol) == ("https://next:4317", "grpc")
    assert via_forward.headers == (("authorization", "Bearer next"),)
    assert (via_forward.insecure, via_forward.timeout_s) == (False, 3.0)
    # An endpoint of its own: forward's protocol, none of forward's credentials.
    own = settings_from_config(
        SimpleNamespace(enabled=True, endpoint="http://evals:4317"), forward=forward
    )
    assert (own.endpoint, own.protocol, own.headers, own.insecure) == (
        "http://evals:4317",
        "grpc",
        (),
        None,
    )


@pytest.mark.parametrize(
    ("endpoint", "protocol", "url"),
    [
        ("http://c:4318", "http/protobuf", "http://c:4318/v1/logs"),
        ("http://c:4318/", "http/protobuf", "http://c:4318/v1/logs"),
        ("https://c/otlp", "http/protobuf", "https://c/otlp/v1/logs"),
        ("https://c/otlp/v1/logs", "http/protobuf", "https://c/otlp/v1/logs"),
        ("http://c:4317", "grpc", "http://c:4317"),
    ],
)
def test_the_http_endpoint_gets_the_logs_path_when_given_a_base(
    endpoint: str, protocol: str, url: str
) -> None:
    assert logs_endpoint(endpoint, protocol) == url
