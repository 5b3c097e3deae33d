"""Test support for the canary gates: strict validation against the rollout controllers' CRD
schemas, Argo Rollouts' verdict on a measurement, and the Rollout, Canary and Deployment the
README shows (kept here so the tests check what users copy).

The CRDs are the upstream files the team keeps in ../shared/crds (provenance in
tests/helm/crds/README.md), vendored gzipped beside this file so that a clean clone, where
../shared does not exist, validates the same; a test checks the copies against ../shared when it
is there."""

from __future__ import annotations

import functools
import gzip
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

from tests.helm import chart

CRDS = Path(__file__).parent / "crds"
SHARED_CRDS = chart.ROOT.parent / "shared" / "crds"
# kind -> (CRD file, the version the chart renders).
CRD_FILES = {
    "AnalysisTemplate": ("argo-rollouts-analysis-template-crd.yaml", "v1alpha1"),
    "ClusterAnalysisTemplate": ("argo-rollouts-cluster-analysis-template-crd.yaml", "v1alpha1"),
    "MetricTemplate": ("flagger-crd.yaml", "v1beta1"),
}
EXAMPLE_CRD_FILES = {
    "Rollout": ("argo-rollouts-rollout-crd.yaml", "v1alpha1"),
    "Canary": ("flagger-crd.yaml", "v1beta1"),
}

README_ROLLOUT = """\
apiVersion: argoproj.io/v1alpha1
kind: Rollout
metadata:
  name: chat
  namespace: shop
spec:
  replicas: 5
  selector:
    matchLabels:
      app: chat
  template:
    metadata:
      labels:
        app: chat
      annotations:
        semhealth.io/inject: "true"
    spec:
      containers:
        - name: app
          image: example/chat:1.3
  strategy:
    canary:
      steps:
        - setWeight: 20
        - pause: {duration: 15m}
        - setWeight: 50
        - pause: {duration: 15m}
      analysis:
        templates:
          - templateName: semhealth-canary
            clusterScope: true
        startingStep: 1
        args:
          - name: canary-hash
            valueFrom:
              podTemplateHashValue: Latest
          - name: stable-hash
            valueFrom:
              podTemplateHashValue: Stable
"""

README_DEPLOYMENT = yaml.safe_load("""\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: chat
  namespace: shop
spec:
  selector:
    matchLabels:
      app: chat
  template:
    metadata:
      labels:
        app: chat
      annotations:
        semhealth.io/inject: "true"
        semhealth.io/variant-label: app
    spec:
      containers:
        - name: app
          image: example/chat:1.3
""")

README_CANARY = """\
apiVersion: flagger.app/v1beta1
kind: Canary
metadata:
  name: chat
  namespace: shop
spec:
  targetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: chat
  service:
    port: 8080
  analysis:
    interval: 1m
    threshold: 5
    maxWeight: 50
    stepWeight: 10
    metrics:
      - name: semhealth-context-relevance
        templateRef:
          name: semhealth-canary-context-relevance
          namespace: semhealth-system
        interval: 10m
        thresholdRange:
          min: -0.05
      - name: semhealth-answer-relevance
        templateRef:
          name: semhealth-canary-answer-relevance
          namespace: semhealth-system
        interval: 10m
        thresholdRange:
          min: -0.05
      - name: semhealth-validity
        templateRef:
          name: semhealth-canary-validity
          namespace: semhealth-system
        interval: 10m
        thresholdRange:
          min: -0.05
"""

# The conditions the chart writes use only this common subset of Argo's expr language and
# Python (len, indexing, comparisons, and), where both mean the same; NaN compares false in both.
_COMMON_SUBSET = re.compile(r"^(len\(result\)|result\[0\]|and|==|>=|<=|<|>|-?[0-9.]+|\s)+$")


def gate_objects(rendered: Mapping[str, str]) -> list[dict[str, Any]]:
    return [o for o in chart.objects(rendered) if o["kind"] in CRD_FILES]


def readme_examples() -> tuple[dict[str, Any], dict[str, Any]]:
    return yaml.safe_load(README_ROLLOUT), yaml.safe_load(README_CANARY)


@functools.cache
def _crd_schema(kind: str) -> dict[str, Any]:
    file, version = {**CRD_FILES, **EXAMPLE_CRD_FILES}[kind]
    text = gzip.decompress((CRDS / f"{file}.gz").read_bytes()).decode()
    for crd in yaml.safe_load_all(text):
        if crd and crd["spec"]["names"]["kind"] == kind:
            (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
            strict: dict[str, Any] = _strict(served["schema"]["openAPIV3Schema"])
            return strict
    raise LookupError(f"no CRD for {kind} in {file}")


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused where the API server would prune them (an
    object with properties and no x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_errors(item: Mapping[str, Any]) -> list[str]:
    """Why ``item`` does not validate against its kind's CRD schema; [] when it does."""
    validator = jsonschema.Draft7Validator(_crd_schema(item["kind"]))
    return [
        f"{item['kind']}/{item['metadata']['name']}: {'.'.join(map(str, e.absolute_path))}: "
        f"{e.message}"
        for e in validator.iter_errors(dict(item))
    ]


def _holds(condition: str, result: list[float]) -> bool:
    assert _COMMON_SUBSET.match(condition), f"not in the Argo/Python common subset: {condition}"
    return bool(eval(condition, {"__builtins__": {}}, {"len": len, "result": result}))


def argo_phase(metric: Mapping[str, Any], result: list[float]) -> str:
    """Argo Rollouts' EvaluateResult for a measurement with both conditions set: Failed when
    the failure condition holds, Successful when the success condition holds, else
    Inconclusive."""
    if _holds(metric["failureCondition"], result):
        return "Failed"
    if _holds(metric["successCondition"], result):
        return "Successful"
    return "Inconclusive"


def flagger_verdict(value: float | None, threshold_min: float) -> str:
    """Flagger's check of one metric: no value (no series, or NaN) halts advancement and
    counts as a failed check; below thresholdRange.min fails; otherwise it passes."""
    if value is None or math.isnan(value):
        return "no values found"
    return "failed" if value < threshold_min else "passed"
