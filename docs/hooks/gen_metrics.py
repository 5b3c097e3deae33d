"""Build-time hook: the metrics reference's tables, from the code's own registrations.

- ``<!-- generated: metrics -->``: the semantic-health and GenAI families, and
- ``<!-- generated: self-metrics -->``: the agent's own ``semhealth_*`` families, both from
  ``metric_families()`` of the module named below: the agent's instrument table and every
  stage's ``observe_*`` registrations, read through a meter that only catalogues them.
- ``<!-- generated: scorer-metrics -->``: the shared scorer's families, from a
  ``ScorerMetrics`` registry collected once with one served encoder.
"""

from __future__ import annotations

import importlib
from typing import Any

from _tables import code, fill, table

MODULE = "semhealth.agent.analysis.agent"
SCORER_MODULE = "semhealth.embeddings.scorer_metrics"
PAGE = "reference/metrics.md"
MARKERS = {
    "semantic": "<!-- generated: metrics -->",
    "self": "<!-- generated: self-metrics -->",
    "scorer": "<!-- generated: scorer-metrics -->",
}
HEADER = ("Prometheus name", "type", "labels", "meaning")


def family_rows(own: bool) -> list[tuple[str, str, str, str]]:
    """(name, type, labels, meaning) of the agent's families: its own ``semhealth_*`` ones
    when ``own``, else the semantic-health and GenAI ones."""
    rows = []
    for family in importlib.import_module(MODULE).metric_families():
        name = family.prometheus_name
        if name.startswith("semhealth_") != own:
            continue
        labels = ", ".join(code(label.replace(".", "_")) for label in family.labels)
        rows.append((code(name), family.kind, labels, family.description))
    return rows


def scorer_rows() -> list[tuple[str, str, str, str]]:
    scorer = importlib.import_module(SCORER_MODULE)
    metrics = scorer.ScorerMetrics()
    served = scorer.EncoderStats(
        encoder="e5",
        requests=1,
        texts=1,
        overloaded_texts=1,
        failed={"UNAVAILABLE": 1},
        queue=scorer.Queue(up=True, queued=1, queue_size=1, texts_per_s=1.0),
        rejected={"queue_full": 1},
    )
    metrics.read_stats(lambda: [served], lambda: {"rate_limited": 1})
    metrics.observe_batch("e5", 1, 0.1)
    metrics.observe_embed("e5", "OK", 0.1)
    rows = []
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted(
            {label for sample in family.samples for label in sample.labels if label != "le"}
        )
        rows.append(
            (code(name), family.type, ", ".join(code(x) for x in labels), family.documentation)
        )
    return sorted(rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    markdown = fill(markdown, MARKERS["semantic"], table(HEADER, family_rows(own=False)), PAGE)
    markdown = fill(markdown, MARKERS["self"], table(HEADER, family_rows(own=True)), PAGE)
    return fill(markdown, MARKERS["scorer"], table(HEADER, scorer_rows()), PAGE)
