from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semhealth.embeddings.calibration import (
    PLATT,
    CalibrationError,
    identity_calibration,
    load_calibration,
)
from semhealth.embeddings.config import Batching, Config, Encoder
from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.jsonl import (
    ANSWER_FIELD,
    CONTEXT_FIELD,
    LineError,
    ScoreSummary,
    calibrate_from_jsonl,
    score_jsonl,
)
from semhealth.embeddings.local import LocalBackend

DATA = (
    Path(__file__).resolve().parents[2]
    / "src"
    / "semhealth"
    / "embeddings"
    / "data"
    / "relevance_pairs.jsonl"
)
SECRET = "the patient's account number is 4411"

RECORD: dict[str, Any] = {
    "id": "r1",
    "query": "How do I reset my password?",
    "context": ["Click 'Forgot password' on the login page.", "Our office opens at 9."],
    "answer": "Use the Forgot password link.",
    "meta": {"tenant": 7, "tags": ["a", "b"]},
}


def line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


async def run(
    lines: Sequence[str | bytes], backend: LocalBackend, **options: Any
) -> tuple[list[dict[str, Any]], ScoreSummary, list[LineError]]:
    out = io.StringIO()
    errors: list[LineError] = []
    config = Config(encoders=(Encoder(batching=options.pop("batching", Batching())),))
    async with open_scorer(config, backend=backend) as scorer:
        summary = await score_jsonl(
            lines, out, scorer, progress=False, on_error=errors.append, **options
        )
    # JSONL lines end at "\n" only: str.splitlines() would also cut at U+0085 or U+2028,
    # which JSON strings may hold unescaped.
    records = [orjson.loads(text) for text in out.getvalue().split("\n") if text]
    return records, summary, errors


# -- score_jsonl -------------------------------------------------------------------------------


async def test_scoring_adds_both_scores_and_keeps_every_other_field_in_order(
    minilm: LocalBackend,
) -> None:
    records, _, _ = await run([line(RECORD)], minilm)
    (record,) = records
    assert list(record) == [*RECORD, CONTEXT_FIELD, ANSWER_FIELD]
    assert {key: record[key] for key in RECORD} == RECORD
    assert 0.0 <= record[CONTEXT_FIELD] <= 1.0
    assert 0.0 <= record[ANSWER_FIELD] <= 1.0


async def test_scores_are_the_sidecar_scorers_calibrated_scores(minilm: LocalBackend) -> None:
    records, _, _ = await run([line(RECORD)], minilm)
    async with open_scorer(backend=minilm) as scorer:
        expected = await scorer.score(RECORD["query"], RECORD["context"], RECORD["answer"])
    assert records[0][CONTEXT_FIELD] == pytest.approx(expected.context, abs=1e-6)
    assert records[0][ANSWER_FIELD] == pytest.approx(expected.answer, abs=1e-6)
    assert expected.context_raw is not None
    assert expected.context == load_calibration("all-MiniLM-L6-v2")(expected.context_raw)


async def test_a_record_without_an_answer_gets_a_null_answer_score(minilm: LocalBackend) -> None:
    record = {key: value for key, value in RECORD.items() if key != "answer"}
    records, _, _ = await run([line(record)], minilm)
    assert records[0][ANSWER_FIELD] is None
    assert records[0][CONTEXT_FIELD] is not None
    assert "answer" not in records[0]


async def test_a_record_with_an_empty_context_gets_a_null_context_score(
    minilm: LocalBackend,
) -> None:
    records, summary, _ = await run([line({**RECORD, "context": []})], minilm)
    assert records[0][CONTEXT_FIELD] is None
    assert records[0][ANSWER_FIELD] is not None
    assert summary.errors == 0


async def test_a_bad_json_line_is_counted_by_number_and_the_run_goes_on(
    minilm: LocalBackend,
) -> None:
    lines = [line(RECORD), '{"query": "' + SECRET + '", oops\n', line({**RECORD, "id": "r3"})]
    records, summary, errors = await run(lines, minilm)
    assert [record["id"] for record in records] == ["r1", "r3"]
    assert (summary.records, summary.written, summary.errors) == (3, 2, 1)
    assert [error.line for error in errors] == [2]
    assert "not valid JSON" in errors[0].reason
    assert SECRET not in str(errors[0])


async def test_a_record_of_the_wrong_shape_is_an_error_naming_the_field(
    minilm: LocalBackend,
) -> None:
    lines = [
        line({"context": ["x"]}),
        line({**RECORD, "context": "one chunk", "answer": 5}),
        line({**RECORD, "context": ["ok", {"text": SECRET}]}),
        "[1, 2]\n",
    ]
    records, summary, errors = await run(lines, minilm)
    assert records == []
    assert summary.errors == 4
    assert [str(error) for error in errors] == [
        "line 1: 'query' must be a string, not missing",
        "line 2: 'answer' must be a string or null, not a number",
        "line 3: 'context[1]' must be a string, not an object",
        "line 4: a record must be a JSON object, not an array",
    ]


async def test_a_context_given_as_one_string_is_one_chunk(minilm: LocalBackend) -> None:
    records, _, _ = await run([line({**RECORD, "context": RECORD["context"][0]})], minilm)
    assert records[0][CONTEXT_FIELD] is not None


async def test_blank_lines_are_skipped_and_line_numbers_still_count_them(
    minilm: LocalBackend,
) -> None:
    records, summary, errors = await run(["\n", line(RECORD), "  \n", "nope\n"], minilm)
    assert len(records) == 1
    assert summary.records == 2
    assert [error.line for error in errors] == [4]


async def test_records_come_out_in_input_order_with_many_in_flight(minilm: LocalBackend) -> None:
    lines = [line({**RECORD, "id": index, "context": [f"chunk {index}"]}) for index in range(9)]
    records, _, _ = await run(lines, minilm, concurrency=2)
    assert [record["id"] for record in records] == list(range(9))


async def test_bytes_lines_are_read_as_utf8(minilm: LocalBackend) -> None:
    record = {**RECORD, "query": "如何重置密码?"}
    records, _, _ = await run([line(record).encode()], minilm)
    assert records[0]["query"] == "如何重置密码?"


async def test_records_larger_than_free_room_wait_instead_of_being_shed(
    minilm: LocalBackend,
) -> None:
    # Each record has 4 texts and the queue holds 4: records must take turns.
    lines = [
        line(
            {
                "id": index,
                "query": f"question {index}",
                "context": [f"first {index}", f"second {index}"],
                "answer": f"answer {index}",
            }
        )
        for index in range(6)
    ]
    batching = Batching(queue_size=4, max_batch=4)
    records, summary, _ = await run(lines, minilm, batching=batching, concurrency=6)
    assert summary.errors == 0
    assert [record["id"] for record in records] == list(range(6))


async def test_a_record_larger_than_the_whole_queue_is_an_error(minilm: LocalBackend) -> None:
    record = {**RECORD, "context": [f"chunk {index}" for index in range(5)]}
    batching = Batching(queue_size=4, max_batch=4)
    records, _, errors = await run([line(record)], minilm, batching=batching)
    assert records == []
    assert "7 texts to embed, more than the scorer's queue of 4" in errors[0].reason


async def test_no_progress_bar_is_drawn_when_stderr_is_not_a_terminal(
    minilm: LocalBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    async with open_scorer(backend=minilm) as scorer:
        await score_jsonl([line(RECORD)], out, scorer, progress=True)
    assert capsys.readouterr().err == ""


async def test_a_concurrency_below_one_is_refused(minilm: LocalBackend) -> None:
    async with open_scorer(backend=minilm) as scorer:
        with pytest.raises(ValueError, match="concurrency"):
            await score_jsonl([], io.StringIO(), scorer, progress=False, concurrency=0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)
records = st.fixed_dictionaries(
    {},
    optional={
        "query": st.text(max_size=20) | json_values,
        "context": st.lists(st.text(max_size=20), max_size=3) | json_values,
        "answer": st.none() | st.text(max_size=20) | json_values,
        "extra": json_values,
    },
).map(lambda record: json.dumps(record, ensure_ascii=False))
lines_strategy = st.lists(
    records | st.text(max_size=30).filter(lambda s: "\n" not in s), max_size=6
)


@settings(max_examples=25, deadline=None)
@given(lines_strategy)
def test_any_input_is_either_written_or_counted_and_never_raises(
    minilm: LocalBackend, texts: list[str]
) -> None:
    records, summary, errors = asyncio.run(run([text + "\n" for text in texts], minilm))
    non_blank = [text for text in texts if text.strip()]
    assert summary.records == len(non_blank)
    assert summary.written + summary.errors == summary.records
    assert len(records) == summary.written
    assert len(errors) == summary.errors
    assert all(CONTEXT_FIELD in record and ANSWER_FIELD in record for record in records)


# -- calibrate_from_jsonl ----------------------------------------------------------------------


def labelled_lines(split: str, count: int = 24) -> list[bytes]:
    """The first ``count`` English pairs of a split: six items, each with all four kinds."""
    rows = [orjson.loads(text) for text in DATA.read_bytes().splitlines() if text.strip()]
    chosen = [r for r in rows if r["split"] == split and r["lang"] == "en"][:count]
    return [
        orjson.dumps({"query": r["query"], "context": r["context"], "label": r["label"]}) + b"\n"
        for r in chosen
    ]


async def test_calibrating_on_labelled_records_gives_a_usable_file(
    minilm: LocalBackend, tmp_path: Path
) -> None:
    lines = labelled_lines("fit")
    async with open_scorer(backend=minilm, calibration=identity_calibration("raw")) as scorer:
        calibration = await calibrate_from_jsonl(lines, scorer, "my-encoder")
    path = tmp_path / "my-encoder.json"
    path.write_text(calibration.to_json())
    loaded = load_calibration("my-encoder", path)
    assert loaded == calibration
    assert loaded.method == PLATT
    assert loaded.a > 0
    assert loaded.n_fit == len(lines)
    async with open_scorer(backend=minilm, calibration_path=path) as scorer:
        scores = await scorer.score("How do I reset my password?", ["Click 'Forgot password'."])
    assert scores.context is not None and 0.0 <= scores.context <= 1.0


async def test_calibrating_fits_raw_scores_whatever_the_scorer_applies(
    minilm: LocalBackend,
) -> None:
    lines = labelled_lines("fit")
    async with open_scorer(backend=minilm, calibration=identity_calibration("raw")) as scorer:
        on_raw = await calibrate_from_jsonl(lines, scorer, "e")
    async with open_scorer(backend=minilm) as scorer:  # the shipped calibration applied
        on_calibrated = await calibrate_from_jsonl(lines, scorer, "e")
    assert on_calibrated.a == pytest.approx(on_raw.a)
    assert on_calibrated.b == pytest.approx(on_raw.b)


async def test_calibrating_skips_and_counts_bad_lines(minilm: LocalBackend) -> None:
    lines = [*labelled_lines("heldout"), b'{"query": "q", "context": "c", "label": 3}\n']
    errors: list[LineError] = []
    async with open_scorer(backend=minilm) as scorer:
        calibration = await calibrate_from_jsonl(lines, scorer, "e", on_error=errors.append)
    assert calibration.metrics["skipped_lines"] == 1
    assert str(errors[0]) == f"line {len(lines)}: 'label' must be 0 or 1, not a number"


async def test_calibrating_on_one_class_is_refused(minilm: LocalBackend) -> None:
    lines = [b'{"query": "q", "context": ["c"], "label": 1}\n'] * 3
    async with open_scorer(backend=minilm) as scorer:
        with pytest.raises(CalibrationError, match="relevant and irrelevant"):
            await calibrate_from_jsonl(lines, scorer, "e")
