"""Replay runs for the report's tests, built the way a replay of an hour of mixed traffic
comes out: several routes, proxy and OTLP records, failed structured outputs, relevance
around the threshold with a dip on one route, and the alerts that dip and the failures set
off. Seeded, so every build is the same run."""

from __future__ import annotations

import random

from semhealth.agent.replay.results import (
    AlertTransition,
    InputProblem,
    RecordResult,
    ReplayRun,
)

START = 1_764_547_200.0  # 2025-12-01 00:00:00 UTC
HOUR = 3600.0
EVIL = "<script>alert(1)</script>"
_VALIDITY_FAILURES = (
    ("schema", ("required",)),
    ("schema", ("required", "type")),
    ("syntax", ("unexpected_end",)),
    ("truncated", ("cut_at_length",)),
)


def _relevance(rng: random.Random, route: str, t: float) -> float | None:
    if route == "/rag/search":
        dip = START + 20 * 60 <= t < START + 35 * 60  # retrieval broke for 15 minutes
        return min(1.0, max(0.0, rng.gauss(0.58 if dip else 0.84, 0.08)))
    if route == "/v1/chat":
        return min(1.0, max(0.0, rng.gauss(0.78, 0.1))) if rng.random() < 0.6 else None
    return None


def _validity(rng: random.Random, route: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if route != "/extract":
        return ()
    if rng.random() < 0.85:
        return (("valid", ()),)
    return (rng.choice(_VALIDITY_FAILURES),)


def record(rng: random.Random, index: int, route: str, t: float) -> RecordResult:
    """One record on ``route`` at ``t``; about one in fifty fails upstream."""
    failed = rng.random() < 0.02
    otlp = route == "/v1/chat" and index % 5 == 0  # an instrumented app: no chunk timing
    streamed = not failed and not otlp
    relevance = _relevance(rng, route, t)
    return RecordResult(
        id=f"ex-{index}",
        source_file="traffic.jsonl" if not otlp else "spans.otlp.json",
        line=index + 1,
        time=t,
        source="otlp" if otlp else "proxy",
        route=route,
        model="gpt-4o-mini",
        provider="openai",
        prompt_class="short",
        status=502 if failed else 200,
        error_type="upstream_5xx" if failed else "",
        duration_s=rng.uniform(0.4, 3.0),
        ttft_s=None if failed else rng.lognormvariate(-1.3, 0.35),
        continuity_index_s=rng.lognormvariate(-5.3, 0.5) if streamed else None,
        max_gap_s=rng.uniform(0.02, 0.3) if streamed else None,
        stalls=1 if streamed and rng.random() < 0.03 else 0,
        input_tokens=rng.randint(50, 3000),
        output_tokens=None if failed else rng.randint(10, 800),
        validity=() if failed else _validity(rng, route),
        context_relevance=relevance,
        answer_relevance=None if relevance is None else min(1.0, relevance + 0.05),
        relevance_skipped=None if relevance is not None or route == "/extract" else "no_query",
    )


def _alert(rule: str, state: str, minute: float, route: str, value: float) -> AlertTransition:
    return AlertTransition(
        rule=rule,
        state=state,
        time=START + minute * 60,
        labels={"route": route, "model": "gpt-4o-mini"},
        value=value,
    )


ALERTS = (
    _alert("ContextRelevanceLow", "pending", 22, "/rag/search", 0.61),
    _alert("ContextRelevanceLow", "firing", 24, "/rag/search", 0.59),
    _alert("ContextRelevanceLow", "resolved", 38, "/rag/search", 0.82),
    _alert("StreamChoppy", "pending", 10, "/v1/chat", 0.016),
    _alert("StreamChoppy", "resolved", 11, "/v1/chat", 0.012),
    _alert("OutputValidityLow", "pending", 41, "/extract", 0.9),
    _alert("OutputValidityLow", "firing", 43, "/extract", 0.88),
)

PROBLEMS = (
    InputProblem(
        source_file="traffic.jsonl", line=17, error="line is not JSON: truncated at byte 912"
    ),
    InputProblem(
        source_file="capture.har",
        line=3,
        error="entry 3: response body is binary (image/png), skipped",
    ),
    InputProblem(
        source_file="spans.otlp.json", line=1, error="this is OTLP metrics, not traces or logs"
    ),
)

ROUTE_WEIGHTS = {"/v1/chat": 5, "/rag/search": 3, "/extract": 2}


def realistic_run(
    count: int = 1200, *, extra_routes: dict[str, int] | None = None, seed: int = 11
) -> ReplayRun:
    """``count`` records spread over an hour, routes drawn by weight."""
    rng = random.Random(seed)
    weights = {**ROUTE_WEIGHTS, **(extra_routes or {})}
    routes = rng.choices(list(weights), weights=list(weights.values()), k=count)
    times = sorted(START + rng.uniform(0, HOUR) for _ in range(count))
    results = tuple(
        record(rng, i, route, t) for i, (route, t) in enumerate(zip(routes, times, strict=True))
    )
    return ReplayRun(
        files=("traffic.jsonl", "capture.har", "spans.otlp.json"),
        results=results,
        alerts=ALERTS,
        problems=PROBLEMS,
        threshold=0.75,
        start=START,
        end=START + HOUR,
    )


def empty_run() -> ReplayRun:
    return ReplayRun(files=("empty.jsonl",), results=(), alerts=(), problems=())
