"""``semhealth score`` and ``semhealth calibrate``: JSONL in, scores or a calibration out.

Both run the real model. ``score`` runs as a subprocess, as a user runs it; ``calibrate``
runs in-process through ``main`` (the model load is the cost, not the process).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from semhealth.agent.cli import main
from semhealth.embeddings.calibration import Calibration, load_calibration
from tests.default_install import HIDE_LOCAL_EXTRA

PAIRS = (
    Path(__file__).parents[2]
    / "src"
    / "semhealth"
    / "embeddings"
    / "data"
    / "relevance_pairs.jsonl"
)
# One encoder, unrouted: these tests need MiniLM only.
CONFIG = """\
relevance:
  route_cjk_to: null
  encoders:
    - name: default
      local:
        model: all-MiniLM-L6-v2
        device: cpu
        threads: 2
"""
RECORDS = [
    {
        "id": 1,
        "query": "How do I reset my password?",
        "context": ["Open Settings, choose Security and click Reset password."],
        "answer": "Open Settings and click Reset password.",
    },
    {"id": 2, "query": "What is the capital of France?", "context": [], "answer": None},
    {"id": 3, "query": "Which port does it use?", "context": ["It listens on port 5432."]},
]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "semhealth.yaml"
    path.write_text(CONFIG, "utf-8")
    return path


def write_jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records))
    return path


def test_score_writes_both_scores_per_record_and_keeps_other_fields(
    tmp_path: Path, config: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "semhealth.agent.cli", "score", str(source)]
    result = subprocess.run(
        [*command, "-o", str(out), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    scored = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [{k: r[k] for k in RECORDS[i]} for i, r in enumerate(scored)] == RECORDS
    first, second, third = scored
    assert 0.0 <= first["context_relevance_score"] <= 1.0
    assert 0.0 <= first["answer_relevance_score"] <= 1.0
    # Nothing to compare: the fields are there, and null.
    assert (second["context_relevance_score"], second["answer_relevance_score"]) == (None, None)
    assert third["answer_relevance_score"] is None
    assert "3 of 3 records scored, 0 skipped" in result.stderr


def test_calibrate_writes_a_loadable_calibration_file(tmp_path: Path, config: Path) -> None:
    lines = [orjson.loads(line) for line in PAIRS.read_bytes().splitlines()]
    english = [r for r in lines if r["lang"] == "en"][:60]
    assert {r["label"] for r in english} == {0, 1}
    source = write_jsonl(tmp_path / "labelled.jsonl", english)
    out = tmp_path / "calibration.json"
    code = main(["calibrate", str(source), "-o", str(out), "--config", str(config)])
    assert code == 0
    calibration = load_calibration("all-MiniLM-L6-v2", out)
    assert isinstance(calibration, Calibration)
    assert (calibration.encoder, calibration.method, calibration.n_fit) == (
        "all-MiniLM-L6-v2",
        "platt",
        60,
    )
    assert calibration(0.9) > calibration(0.1)


def test_calibrate_of_an_unknown_encoder_is_a_config_error(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "labelled.jsonl", [])
    out = str(tmp_path / "c.json")
    code = main(["calibrate", str(source), "-o", out, "--config", str(config), "--encoder", "nope"])
    assert code == 2
    assert "encoder 'nope' is not among the encoders" in capsys.readouterr().err


def test_score_of_a_missing_file_says_so(tmp_path: Path, config: Path) -> None:
    code = main(["score", str(tmp_path / "gone.jsonl"), "--config", str(config)])
    assert code == 1


# `semhealth score` as on a default install: sentence-transformers and torch cannot be found.
_SCORE_WITHOUT_LOCAL_EXTRA = (
    HIDE_LOCAL_EXTRA + "from semhealth.agent.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)


def _score_without_local_extra(tmp_path: Path, *options: str) -> tuple[str, dict[str, Any]]:
    source = write_jsonl(tmp_path / "in.jsonl", RECORDS[:1])
    out = tmp_path / "out.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCORE_WITHOUT_LOCAL_EXTRA,
            "score",
            str(source),
            "-o",
            str(out),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (scored,) = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    return result.stderr, scored


def test_score_on_a_default_install_scores_with_e5_and_no_fallback(tmp_path: Path) -> None:
    stderr, scored = _score_without_local_extra(tmp_path)
    assert "is not installed" not in stderr
    # A clear match: on the relevant side of the threshold.
    assert scored["context_relevance_score"] > 0.75


def test_score_of_the_fast_profile_without_the_local_extra_falls_back_to_use_and_says_so(
    tmp_path: Path,
) -> None:
    fast = tmp_path / "fast.yaml"
    fast.write_text("relevance:\n  profile: fast\n")
    stderr, scored = _score_without_local_extra(tmp_path, "--config", str(fast))
    assert "sentence-transformers is not installed" in stderr
    # A clear match scores high with USE too.
    assert scored["context_relevance_score"] > 0.5
