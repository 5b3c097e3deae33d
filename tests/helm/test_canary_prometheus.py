"""The canary gates' queries against a real Prometheus (Debian's ``prometheus``) holding canary
and stable series, backfilled with ``promtool tsdb create-blocks-from openmetrics``: the
rendered AnalysisTemplate's and MetricTemplates' queries, with their placeholders filled in
as Argo Rollouts and Flagger fill them, give a failing verdict for a canary 10 % below
stable, a passing one at 2 %, and no result at all with too few samples on a side.

One Prometheus holds every scenario under its own variant values (Argo: pod-template hashes;
Flagger: ``<target>``/``<target>-primary`` in their own namespaces). Scores are spread
evenly over a uniform range per minute, so each side's median is known (stable 0.75)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from semhealth.agent.telemetry import buckets
from tests.agent.prometheus_server import PrometheusServer, require_binary
from tests.helm import canary, chart

MINUTE = 60
SPAN_MIN = 40  # backfilled minutes; queried at minute 30 with 10-minute windows
QUERY_MIN = 30
PER_MINUTE = 200  # scores a side per minute: 2000 in a 10-minute window
FEW_PER_MINUTE = 1  # 10 in a window: under the 20 minimum
STABLE_RANGE = (0.6, 0.9)  # median 0.75, inside the dense part of buckets.RELEVANCE
STABLE_VALID_SHARE = 0.9
TOLERANCE = 0.05

ARGO_STABLE = "5b7c8d9e1"
NAMESPACE = "shop"


@dataclass(frozen=True)
class Side:
    """One variant's series: its scores scaled by ``factor`` against stable's."""

    variant: str
    namespace: str
    factor: float
    per_minute: int = PER_MINUTE


# Argo: canary hash -> (its drop, its scores a minute); stable is ARGO_STABLE.
ARGO = {"6d4f9c7b8": (0.10, PER_MINUTE), "7a1b2c3d4": (0.02, PER_MINUTE), "8e9f0a1b2": (0.10, FEW_PER_MINUTE)}  # fmt: skip
# Flagger: namespace -> (the canary's drop, its scores a minute); target "chat".
FLAGGER = {"shop-10": (0.10, PER_MINUTE), "shop-2": (0.02, PER_MINUTE), "shop-few": (0.10, FEW_PER_MINUTE)}  # fmt: skip
TARGET = "chat"


def _sides() -> list[Side]:
    sides = [Side(ARGO_STABLE, NAMESPACE, 1.0)]
    sides += [Side(h, NAMESPACE, 1 - drop, n) for h, (drop, n) in ARGO.items()]
    for namespace, (drop, n) in FLAGGER.items():
        sides += [Side(f"{TARGET}-primary", namespace, 1.0), Side(TARGET, namespace, 1 - drop, n)]
    return sides


def _scores(side: Side, low: float, high: float) -> list[float]:
    """One minute's scores: evenly spread over the side's uniform range."""
    low, high = low * side.factor, high * side.factor
    n = side.per_minute
    return [low + (high - low) * (j + 0.5) / n for j in range(n)]


def _labels(side: Side, **extra: str) -> str:
    pairs = {"route": "chat", "namespace": side.namespace, "variant": side.variant, **extra}
    return ",".join(f'{k}="{v}"' for k, v in pairs.items())


def _histogram(name: str, low: float, high: float, start: int) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    for side in _sides():
        scores = _scores(side, low, high)
        for minute in range(SPAN_MIN + 1):
            t = start + minute * MINUTE
            for bound in (*buckets.RELEVANCE, float("inf")):
                le = "+Inf" if bound == float("inf") else repr(bound)
                count = minute * sum(1 for s in scores if s <= bound)
                lines.append(f"{name}_bucket{{{_labels(side, le=le)}}} {count} {t}")
            lines.append(f"{name}_count{{{_labels(side)}}} {minute * len(scores)} {t}")
            lines.append(f"{name}_sum{{{_labels(side)}}} {minute * sum(scores):.6f} {t}")
    return lines


def _outputs(start: int) -> list[str]:
    lines = ["# TYPE semantic_health_outputs counter"]
    for side in _sides():
        for result in ("valid", "schema"):
            share = STABLE_VALID_SHARE * side.factor
            per_minute = side.per_minute * (share if result == "valid" else 1 - share)
            for minute in range(SPAN_MIN + 1):
                t = start + minute * MINUTE
                labels = _labels(side, result=result)
                lines.append(
                    f"semantic_health_outputs_total{{{labels}}} {minute * per_minute:.6f} {t}"
                )
    return lines


def openmetrics(start: int) -> str:
    lines = [
        *_histogram("semantic_health_context_relevance_score", *STABLE_RANGE, start),
        *_histogram("semantic_health_answer_relevance_score", 0.55, 0.95, start),
        *_outputs(start),
        "# EOF",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Backfilled:
    server: PrometheusServer
    at: float  # a Unix time inside the backfilled span

    def query(self, promql: str) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": promql, "time": f"{self.at:.3f}"})
        with urllib.request.urlopen(f"{self.server.url}/api/v1/query?{params}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        assert body["data"]["resultType"] == "vector"
        return list(body["data"]["result"])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    promtool = require_binary("promtool")
    workdir = tmp_path_factory.mktemp("canary-prometheus")
    # Two hours back, on a minute: old enough to be all in blocks, well inside retention.
    start = (int(time.time()) - 2 * 3600) // MINUTE * MINUTE
    source = workdir / "series.om"
    source.write_text(openmetrics(start))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(workdir / "data")],
        check=True,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    # Nothing listens on the discard port: the one scrape job fails, the blocks are what count.
    with PrometheusServer("127.0.0.1:9", workdir) as server:
        yield Backfilled(server, start + QUERY_MIN * MINUTE)


@pytest.fixture(scope="module")
def gates(chart_dir: Path) -> list[dict[str, Any]]:
    values = {"canary": {"argoRollouts": {"enabled": True}, "flagger": {"enabled": True}}}
    return canary.gate_objects(chart.render(chart_dir, values))


def _argo_query(metric: dict[str, Any], canary_hash: str) -> str:
    """The query as Argo Rollouts sends it: {{args.NAME}} replaced by the run's arguments
    (the Rollout's podTemplateHashValue Latest and Stable, the template's route default)."""
    args = {"canary-hash": canary_hash, "stable-hash": ARGO_STABLE, "route": ".*"}
    query: str = metric["provider"]["prometheus"]["query"]
    for name, value in args.items():
        query = query.replace(f"{{{{args.{name}}}}}", value)
    assert "{{" not in query
    return query


def _flagger_query(template: dict[str, Any], namespace: str) -> str:
    """The query as Flagger renders it for Canary ``chat`` in ``namespace`` with the README's
    metric interval."""
    query: str = template["spec"]["query"]
    for name, value in {"target": TARGET, "namespace": namespace, "interval": "10m"}.items():
        query = query.replace(f"{{{{ {name} }}}}", value)
    assert "{{" not in query
    return query


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


@pytest.mark.parametrize(("canary_hash", "drop", "phase"), [
    ("6d4f9c7b8", 0.10, "Failed"),
    ("7a1b2c3d4", 0.02, "Successful"),
    ("8e9f0a1b2", None, "Inconclusive"),
])  # fmt: skip
def test_argo_analysis_fails_at_10_percent_passes_at_2_and_waits_on_few_samples(
    prometheus: Backfilled,
    gates: list[dict[str, Any]],
    canary_hash: str,
    drop: float | None,
    phase: str,
) -> None:
    metrics = chart.one(gates, "AnalysisTemplate")["spec"]["metrics"]
    assert {m["name"] for m in metrics} == {"context-relevance", "answer-relevance", "validity"}
    for metric in metrics:
        values = _values(prometheus.query(_argo_query(metric, canary_hash)))
        if drop is None:
            assert values == [], metric["name"]
            # The canary has series, just too few samples: the guard is what empties it.
            counted = prometheus.query(
                f'sum(increase(semantic_health_context_relevance_score_count{{variant="{canary_hash}"}}[10m]))'
            )
            assert 0 < float(counted[0]["value"][1]) < 20
        else:
            (value,) = values
            # Histogram medians are interpolated inside 0.025-wide buckets.
            assert value == pytest.approx(-drop, abs=0.015), metric["name"]
        assert canary.argo_phase(metric, values) == phase, (metric["name"], values)


@pytest.mark.parametrize(("namespace", "drop", "verdict"), [
    ("shop-10", 0.10, "failed"),
    ("shop-2", 0.02, "passed"),
    ("shop-few", None, "no values found"),
])  # fmt: skip
def test_flagger_metrics_fail_at_10_percent_pass_at_2_and_find_nothing_on_few_samples(
    prometheus: Backfilled,
    gates: list[dict[str, Any]],
    namespace: str,
    drop: float | None,
    verdict: str,
) -> None:
    _, canary_example = canary.readme_examples()
    minimum = {m["templateRef"]["name"]: m["thresholdRange"]["min"] for m in canary_example["spec"]["analysis"]["metrics"]}  # fmt: skip
    templates = chart.by_kind(gates, "MetricTemplate")
    assert len(templates) == 3
    for template in templates:
        values = _values(prometheus.query(_flagger_query(template, namespace)))
        name = template["metadata"]["name"]
        if drop is None:
            assert values == [], name
            value = None
        else:
            (value,) = values
            assert value == pytest.approx(-drop, abs=0.015), name
        assert canary.flagger_verdict(value, minimum[name]) == verdict, (name, values)


def test_the_exported_rule_and_the_gate_agree_on_the_same_series(
    prometheus: Backfilled, gates: list[dict[str, Any]]
) -> None:
    """The alert's own comparison (its threshold dropped) on the same series gives the same
    relative change as the gate: one PromQL, two consumers."""
    rules = {
        r["alert"]: r["expr"]
        for g in yaml.safe_load((chart.CHART_DIR / "files" / "prometheus-rules.yaml").read_text())[
            "groups"
        ]
        for r in g["rules"]
        if "alert" in r
    }
    expr = rules["CanaryRelevanceDrop"].replace(" < -0.05", "")
    expr = expr.replace('variant="canary"', 'variant="6d4f9c7b8"')
    expr = expr.replace('variant="stable"', f'variant="{ARGO_STABLE}"')
    (alert_value,) = _values(prometheus.query(expr))
    metric = next(
        m for m in chart.one(gates, "AnalysisTemplate")["spec"]["metrics"]
        if m["name"] == "context-relevance"
    )  # fmt: skip
    (gate_value,) = _values(prometheus.query(_argo_query(metric, "6d4f9c7b8")))
    assert gate_value == pytest.approx(alert_value)
    assert alert_value < -TOLERANCE
