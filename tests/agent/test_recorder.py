"""The recorder's own rules: cardinality guard, rolling validity window, error classes,
what each kind of exchange feeds, and the samples it hands the alert evaluator."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from semhealth.agent.telemetry import instruments as m
from semhealth.agent.telemetry.recorder import (
    OTHER,
    LabelGuard,
    Recorder,
    RecorderSettings,
    RollingRatio,
    error_type,
)
from semhealth.alerts.sample import Sample
from semhealth.alerts.signals import SIGNALS
from semhealth.collectors.collector import StreamCollector, check_record
from semhealth.collectors.config import Config
from semhealth.collectors.exchange import Exchange
from semhealth.collectors.record import RequestFacts, StreamRecord, StructureRequest, Usage
from semhealth.collectors.validity import SchemaCache
from semhealth.embeddings.relevance import RelevanceScores


def _record(**fields: object) -> StreamRecord:
    base = StreamRecord(
        route="r", provider="openai_chat", model="m", prompt_class="short",
        request=RequestFacts(), status=200, start_ns=0, end_ns=1,
    )  # fmt: skip
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def _checked(record: StreamRecord, contract: dict[str, Any] | None = None) -> StreamRecord:
    """The record as the collectors hand it over: continuity and validity filled in."""
    return check_record(record, stall_threshold_s=0.5, contract=contract, schemas=SchemaCache())


def test_label_values_past_the_limit_fold_into_other() -> None:
    guard = LabelGuard(max_values=2)
    assert [guard.fold("model", v) for v in ("a", "b", "c", "a", "d")] == [
        "a",
        "b",
        OTHER,
        "a",
        OTHER,
    ]
    assert guard.folded == 2


def test_label_guard_limits_each_key_separately() -> None:
    guard = LabelGuard(max_values=1)
    assert guard.fold("model", "a") == "a"
    assert guard.fold("route", "x") == "x"


def test_rolling_ratio_is_valid_over_checked_within_the_window() -> None:
    ratio = RollingRatio(window_s=60, slots=6)
    key = ("r", "m", "p")
    for ok in (True, True, False, True):
        ratio.add(key, ok, now=100.0)
    assert ratio.ratios(now=100.0) == {key: 0.75}


def test_rolling_ratio_forgets_outputs_older_than_the_window() -> None:
    ratio = RollingRatio(window_s=60, slots=6)
    key = ("r", "m", "p")
    ratio.add(key, False, now=0.0)
    ratio.add(key, True, now=65.0)
    assert ratio.ratios(now=65.0) == {key: 1.0}


def test_rolling_ratio_is_absent_once_the_window_is_empty() -> None:
    ratio = RollingRatio(window_s=60, slots=6)
    ratio.add(("r", "m", "p"), True, now=0.0)
    assert ratio.ratios(now=500.0) == {}


def test_rate_limits_are_split_by_who_throttled() -> None:
    assert (
        error_type(_record(status=429, error_type="429", ratelimit_source="upstream"))
        == "429_upstream"
    )
    assert (
        error_type(_record(status=429, error_type="429", ratelimit_source="Gateway"))
        == "429_gateway"
    )
    assert error_type(_record(status=429, error_type="429")) == "429"


def test_a_ratelimit_source_that_is_not_a_word_is_not_echoed_into_labels() -> None:
    assert error_type(_record(status=429, error_type="429", ratelimit_source="x y/../z")) == "429"


def test_success_has_no_error_type() -> None:
    assert error_type(_record()) == ""


def test_rolling_ratio_can_be_read_from_another_thread_while_written() -> None:
    # The OTLP reader collects on its own thread while the loop records outputs.
    import threading

    ratio = RollingRatio(window_s=60, slots=6)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                ratio.ratios(now=30.0)
            except BaseException as exc:
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(20_000):
        ratio.add((f"r{i % 50}", "m", "p"), i % 2 == 0, now=30.0)
    stop.set()
    reader.join()
    assert errors == []
    assert sum(1 for _ in ratio.ratios(now=30.0)) == 50


def _sampling_recorder() -> tuple[Recorder, list[Sample]]:
    samples: list[Sample] = []
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], views=m.views())
    recorder = Recorder(
        m.Instruments(provider.get_meter("test")),
        RecorderSettings(),
        wall_clock=lambda: 1_700_000_000.0,
        consume_sample=samples.append,
    )
    return recorder, samples


def _streamed_json_record(text: str, **fields: object) -> StreamRecord:
    ms = 1_000_000
    record = _record(
        request=RequestFacts(structure=(StructureRequest(kind="json_object"),)),
        streamed=True,
        done=True,
        start_ns=0,
        first_byte_ns=40 * ms,
        first_delta_ns=50 * ms,
        delta_ns=(50 * ms, 60 * ms, 80 * ms),
        end_ns=100 * ms,
        output_text=text,
        usage=Usage(input_tokens=10, output_tokens=3),
    )
    return _checked(dataclasses.replace(record, **fields))  # type: ignore[arg-type]


def test_each_recorded_signal_is_also_a_sample_for_the_alert_evaluator() -> None:
    recorder, samples = _sampling_recorder()
    recorder.consume_record(_streamed_json_record('{"a": 1}'))
    by_name = {sample.name: sample.value for sample in samples}
    assert by_name == pytest.approx(
        {
            "request_success_rate": 1.0,
            "operation_duration": 0.1,
            "time_to_first_chunk": 0.04,
            "time_to_first_token": 0.05,
            "time_per_output_token": 0.015,
            "stream_continuity_index": 0.005,
            "stream_max_gap": 0.02,
            "model_output_validity_rate": 1.0,
        }
    )
    assert {sample.t for sample in samples} == {1_700_000_000.0}


def test_every_sample_names_a_signal_the_alerts_package_knows() -> None:
    recorder, samples = _sampling_recorder()
    recorder.consume_record(_streamed_json_record('{"a": 1}'))
    recorder.record_relevance(
        _record(),
        RelevanceScores(context=0.8, answer=0.7, context_raw=0.5, answer_raw=0.4, chunks=1),
    )
    assert {sample.name for sample in samples} <= {signal.name for signal in SIGNALS}
    assert {"context_relevance_score", "answer_relevance_score"} <= {s.name for s in samples}


def test_an_invalid_output_is_a_zero_validity_sample() -> None:
    recorder, samples = _sampling_recorder()
    recorder.consume_record(_streamed_json_record('{"a": '))
    assert [s.value for s in samples if s.name == "model_output_validity_rate"] == [0.0]


def test_genai_samples_carry_the_short_label_names_with_the_conventions_values() -> None:
    recorder, samples = _sampling_recorder()
    recorder.consume_record(_streamed_json_record('{"a": 1}'))
    (duration,) = [s for s in samples if s.name == "operation_duration"]
    assert duration.labels == {
        "route": "r", "model": "m", "provider": "openai", "prompt_class": "short"
    }  # fmt: skip


def test_samples_carry_no_text_from_the_exchange() -> None:
    recorder, samples = _sampling_recorder()
    canary = "CANARY-7f3a"
    recorder.consume_record(_streamed_json_record(f'{{"secret": "{canary}"}}'))
    assert samples
    assert all(canary not in repr(sample) for sample in samples)


# --- what each kind of exchange feeds ---------------------------------------------------------


def _recording() -> tuple[Recorder, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=m.views())
    return Recorder(m.Instruments(provider.get_meter("test")), RecorderSettings()), reader


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Data points by instrument name; instruments nothing was recorded into are absent."""
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def _requests(points: dict[str, list[Any]]) -> dict[tuple[str, str], int]:
    return {
        (p.attributes["status_class"], p.attributes["error_type"]): p.value
        for p in points["semantic_health_requests"]
    }


# Everything but the request counter, the operation duration and the token usage: only whole,
# successful streams feed these.
_STREAM_ONLY = {
    "gen_ai.client.operation.time_to_first_chunk",
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
    "gen_ai.client.operation.time_per_output_chunk",
    "semantic_health_stream_continuity_index",
    "semantic_health_stream_max_gap",
    "semantic_health_stream_stalls",
    "semantic_health_outputs",
    "semantic_health_output_failure_reasons",
}


def test_a_whole_stream_feeds_every_stream_signal() -> None:
    recorder, reader = _recording()
    recorder.consume_record(_streamed_json_record('{"a": 1}'))
    points = _points(reader)
    assert _requests(points) == {("2xx", ""): 1}
    # A valid output has no failure reasons, and this stream no stall.
    quiet = {"semantic_health_stream_stalls", "semantic_health_output_failure_reasons"}
    assert _STREAM_ONLY - quiet <= points.keys()
    (per_chunk,) = points["gen_ai.client.operation.time_per_output_chunk"]
    assert (per_chunk.count, per_chunk.sum) == (2, pytest.approx(0.03))  # 10 ms and 20 ms


_REASONING = "gen_ai.client.inference.usage.reasoning.output_tokens"


def test_reasoning_tokens_are_recorded_apart_and_stay_inside_output_tokens() -> None:
    recorder, reader = _recording()
    recorder.consume_record(_record(usage=Usage(10, 40, 25)))
    points = _points(reader)
    (reasoning,) = points[_REASONING]
    assert (reasoning.count, reasoning.sum) == (1, 25)
    assert reasoning.attributes["gen_ai.provider.name"] == "openai"
    assert "gen_ai.token.type" not in reasoning.attributes
    usage = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert usage == {"input": 10, "output": 40}


def test_tools_the_provider_ran_are_counted_by_kind() -> None:
    recorder, reader = _recording()
    recorder.consume_record(_record(provider_tools=("web_search", "code_execution", "web_search")))
    points = _points(reader)["semantic_health_provider_tool_calls"]
    assert {p.attributes["tool_kind"]: p.value for p in points} == {
        "web_search": 2,
        "code_execution": 1,
    }


def test_a_provider_that_reports_no_reasoning_count_opens_no_reasoning_series() -> None:
    recorder, reader = _recording()
    recorder.consume_record(_record(usage=Usage(10, 40)))
    assert _REASONING not in _points(reader)


def test_a_client_that_left_mid_stream_is_counted_as_client_aborted_and_feeds_no_stream_signal() -> (
    None
):
    recorder, reader = _recording()
    record = _streamed_json_record('{"a": 1', client_aborted=True, error_type="client_aborted")
    assert record.continuity is None and record.validity == ()
    recorder.consume_record(record)
    points = _points(reader)
    assert _requests(points) == {("2xx", "client_aborted"): 1}
    assert not _STREAM_ONLY & points.keys()
    (duration,) = points["gen_ai.client.operation.duration"]
    assert duration.attributes["error.type"] == "client_aborted"


def test_an_upstream_that_died_mid_stream_feeds_no_latency_but_keeps_continuity_and_validity() -> (
    None
):
    # The user saw the stutter and got the cut answer: those stay counted (as today).
    recorder, reader = _recording()
    record = _streamed_json_record(
        '{"a": 1', upstream_aborted=True, error_type="upstream_aborted", done=False
    )
    recorder.consume_record(record)
    points = _points(reader)
    assert _requests(points) == {("2xx", "upstream_aborted"): 1}
    assert "gen_ai.server.time_to_first_token" not in points
    assert "gen_ai.client.operation.time_per_output_chunk" not in points
    assert "semantic_health_stream_continuity_index" in points
    (outputs,) = points["semantic_health_outputs"]
    assert outputs.attributes["result"] == "truncated"


_CHAT_BODY = orjson.dumps(
    {
        "model": "gpt-4o-mini",
        "stream": True,
        "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "hi"}],
    }
)


def _unanswered(status: int, *, error: str | None, client_aborted: bool) -> StreamRecord:
    """The record the tap builds for an exchange the upstream never answered."""
    exchange = Exchange(
        method="POST", path="/v1/chat/completions", start_ns=0, status=status,
        content_type=None, content_encoding=None, response_ns=None, request_body=_CHAT_BODY,
    )  # fmt: skip
    return StreamCollector(exchange, Config()).finish(
        250_000_000, error_type=error, client_aborted=client_aborted
    )


@pytest.mark.parametrize(
    ("status", "error", "client_aborted", "expected"),
    [
        (502, "upstream_unreachable", False, ("5xx", "upstream_unreachable")),
        (504, "upstream_timeout", False, ("5xx", "upstream_timeout")),
        (499, None, True, ("4xx", "client_aborted")),
    ],
)
def test_an_exchange_without_an_upstream_response_is_counted_with_its_error_type(
    status: int, error: str | None, client_aborted: bool, expected: tuple[str, str]
) -> None:
    recorder, reader = _recording()
    recorder.consume_record(_unanswered(status, error=error, client_aborted=client_aborted))
    points = _points(reader)
    assert _requests(points) == {expected: 1}
    (duration,) = points["gen_ai.client.operation.duration"]
    assert isinstance(duration, HistogramDataPoint)
    assert duration.attributes["error.type"] == expected[1]
    assert duration.sum == pytest.approx(0.25)
    assert set(points) == {"semantic_health_requests", "gen_ai.client.operation.duration"}


def test_the_recorder_records_the_verdicts_the_record_carries() -> None:
    # It does not check the output again: a record handed over unchecked records no verdict.
    recorder, reader = _recording()
    unchecked = dataclasses.replace(_streamed_json_record('{"a": 1}'), validity=())
    recorder.consume_record(unchecked)
    assert "semantic_health_outputs" not in _points(reader)
