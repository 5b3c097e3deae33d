"""Each folder's public names are deliberate: adding or removing one is a decision, made here."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

SURFACE = {
    "semhealth.alerts": {
        "RULES_SCHEMA", "SIGNALS", "Alert", "AlertsError", "Baseline", "DeliveryStats",
        "Evaluator", "EvaluatorStats", "GroupStatus", "Notifier", "NotifierSettings", "Rule",
        "RuleError", "RuleIssue", "RuleStatus", "Sample", "Signal", "Thresholds",
        "default_rule_entries", "load_rules", "parse_rules", "render_rules", "rule_groups",
        "signal_named",
    },
    "semhealth.agent": {"Agent", "Config", "ConfigError", "Settings", "default_config", "load_config"},
    "semhealth.collectors": {
        "Analysis", "Config", "Continuity", "DecodeError", "Decoder", "Exchange", "Extract",
        "Frame", "JSONBodyDecoder", "JSONChecker", "SchemaCache", "ValidityResult",
        "check_output", "validate_record", "LengthPrefixedDecoder", "Limits", "NDJSONDecoder",
        "RequestFacts", "Route", "SSEDecoder", "StreamCollector", "StreamRecord", "StreamState",
        "StructureRequest", "ToolCall", "Usage", "default_config", "detect_framing",
        "extract_request", "make_decoder", "match_route", "measure_continuity",
    },
    "semhealth.collectors.adapters": {
        "ADAPTER_NAMES", "Adapter", "AnthropicMessagesAdapter", "OllamaAdapter",
        "OpenAIChatAdapter", "OpenAICompletionsAdapter", "OpenAIResponsesAdapter",
        "SniffingAdapter", "TGIAdapter", "detect_provider", "make_adapter",
    },
    "semhealth.embeddings": {
        "Backend", "BackendError", "BatcherStats", "Batching", "Cache", "CacheStats",
        "Calibration", "Closed", "Config", "ConfigIssue", "Embedder", "EmbeddingError", "Encoder",
        "Local", "LocalBackend", "MicroBatcher", "ModelLoadError", "OpenAICompatibleBackend",
        "Overloaded", "RelevanceScorer", "RelevanceScores", "RemoteScorerBackend", "TEIBackend",
        "Vectors", "answer_relevance", "context_relevance", "default_config", "estimate_tokens",
        "fit_calibration", "load_calibration", "normalize_rows", "resolve_model",
        "RoutingScorer", "UseBackend", "has_cjk",
    },
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_all_lists_exactly_the_public_names(module: str) -> None:
    imported = importlib.import_module(module)
    assert set(imported.__all__) == SURFACE[module]
    for name in imported.__all__:
        assert hasattr(imported, name)


@pytest.mark.parametrize("package", ["collectors", "embeddings", "alerts"])
def test_analysis_packages_never_import_the_agent(package: str) -> None:
    # A fresh interpreter, so modules other tests imported do not mask an import.
    probe = (
        f"import sys, semhealth.{package}; "
        "sys.exit(any(m.startswith('semhealth.agent') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0
