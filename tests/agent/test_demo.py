"""The demo's live table: what a newcomer reads while the simulated traffic runs."""

from __future__ import annotations

import argparse
import importlib.util
import io
from typing import Any

import pytest

from semhealth.agent.analysis.alerting import ActiveAlert
from semhealth.agent.demo.run import DemoSummary, run_demo
from semhealth.collectors import RequestFacts, StreamRecord
from semhealth.embeddings import RelevanceScores


def test_the_table_says_when_no_alert_is_pending_or_firing() -> None:
    text = DemoSummary(0.5).render()
    assert "alerts: none pending or firing" in text


def test_the_table_lists_pending_and_firing_alerts_with_labels_and_value() -> None:
    alerts = [
        ActiveAlert("OutputValidityLow", {"route": "chat", "model": "m"}, "firing", 0.8512),
        ActiveAlert("LatencySLO", {"route": "chat", "prompt_class": "short"}, "pending", None),
    ]
    text = DemoSummary(0.5, alerts=lambda: alerts).render()
    assert "alerts: 2 pending or firing" in text
    assert "firing  OutputValidityLow     model=m route=chat  value=0.851" in text
    assert "pending LatencySLO" in text and "value=-" in text


def record(route: str, provider: str = "openai_chat") -> StreamRecord:
    return StreamRecord(
        route=route,
        provider=provider,
        model="m",
        prompt_class="short",
        request=RequestFacts(query="q", context=("c",)),
        status=200,
        start_ns=0,
        end_ns=1,
    )


def scores(context: float | None) -> RelevanceScores:
    return RelevanceScores(context, None, context, None, 1)


def test_the_table_shows_mean_context_relevance_per_route() -> None:
    summary = DemoSummary(0.5)
    for route, context in (("chat", 0.9), ("chat", 0.5), ("json", None)):
        summary.consume_record(record(route))
        summary.consume_scores(record(route), scores(context))
    header, chat, json_row = summary.render().splitlines()[1:4]
    assert header.endswith("  ctx rel")
    assert chat.startswith("chat") and chat.endswith("     0.70")
    assert json_row.startswith("json") and json_row.endswith("        -")  # nothing scored


def demo_args(duration_s: float) -> argparse.Namespace:
    return argparse.Namespace(
        seed=7,
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        log_level=None,
        concurrency=8,
        rate=8.0,
        duration=duration_s,
    )


def context_relevance_column(table: str) -> list[str]:
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("route"))
    # The table's rows run up to the alerts section (whose lines list pending alerts).
    rows = []
    for line in lines[start + 1 :]:
        if not line or line.startswith("alerts"):
            break
        rows.append(line)
    return [row.split()[-1] for row in rows]


def hide_sentence_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "sentence_transformers" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("installed", ["local extra", "default install"])
async def test_the_demo_scores_context_relevance_from_the_first_command(
    installed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real demo: simulated LLM, real sidecar, real encoders (they load in a few seconds).
    # The default profile needs no local extra: both installs score with e5, no fallback.
    if installed == "default install":
        hide_sentence_transformers(monkeypatch)
    out = io.StringIO()
    assert await run_demo(demo_args(duration_s=8.0), out) == 0
    text = out.getvalue()
    e5 = "encoder 'e5' (multilingual-e5-small-q4), every request, in every language"
    assert f"context relevance: {e5}" in text
    assert "is not installed" not in text
    final = text[text.rindex("streams analysed:") :]
    values = [float(v) for v in context_relevance_column(final) if v != "-"]
    assert values, final
    assert all(0.0 <= v <= 1.0 for v in values)
