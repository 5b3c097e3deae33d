"""Moved: ``open_scorer`` to ``factory``, the JSONL commands to ``jsonl``.

This module only re-exports them for importers not yet moved (``agent/app.py``,
``bench/fit_calibration.py``); delete it once they import from the new modules. Importing
it imports ``jsonl`` and with it tqdm, which the live scorer does not need.
"""

from semhealth.embeddings.factory import open_scorer
from semhealth.embeddings.jsonl import (
    ANSWER_FIELD,
    CONTEXT_FIELD,
    LineError,
    LineSink,
    ScoreSummary,
    calibrate_from_jsonl,
    log_line_error,
    score_jsonl,
)

__all__ = [
    "ANSWER_FIELD",
    "CONTEXT_FIELD",
    "LineError",
    "LineSink",
    "ScoreSummary",
    "calibrate_from_jsonl",
    "log_line_error",
    "open_scorer",
    "score_jsonl",
]
