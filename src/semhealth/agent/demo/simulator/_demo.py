"""``semhealth demo``'s upstream: randomised, realistic scripts drawn per ``DemoProfile``."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from semhealth.agent.demo.simulator._corpus import FALLBACK, best_entry, has_cjk, query_text
from semhealth.agent.demo.simulator._script import Script, ScriptRequest, ToolScript


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoProfile:
    """Settings of ``semhealth demo``: how the simulated upstream answers (``demo_script``) and
    what the traffic generator asks (``semhealth.agent.demo.traffic``). Rates are per request, 0..1.

    The defaults give a healthy-looking service with enough trouble to move every signal
    within a minute of demo traffic.
    """

    # -- upstream timing
    ttft_median_s: float = 0.15  # TTFT is lognormal around this median ...
    ttft_sigma: float = 0.35  # ... with this shape: ~68% within x/÷1.4 (e^0.35) of it
    gap_min_s: float = 0.020  # each stream's typical inter-token gap is uniform in [min, max]
    gap_max_s: float = 0.040
    gap_jitter_s: float = 0.006  # Gaussian jitter of each gap around the stream's typical gap
    stall_rate: float = 0.05  # one gap of the stream becomes a stall ...
    stall_min_s: float = 1.0  # ... lasting uniformly between these
    stall_max_s: float = 2.0
    # -- upstream failures
    rate_limit_rate: float = 0.03  # 429 with X-RateLimit-Source: upstream, retry-after: 1
    malformed_json_rate: float = 0.08  # structured output with a JSON syntax error
    truncated_json_rate: float = 0.05  # structured output cut off, finish_reason length
    schema_violation_rate: float = 0.05  # parses, but a required field is missing
    # -- traffic mix: relative weights of the request kinds
    mix_chat_stream: float = 0.35  # OpenAI chat, streamed, with include_usage
    mix_chat_json: float = 0.15  # OpenAI chat in JSON mode or with a JSON Schema
    mix_chat_tool: float = 0.10  # OpenAI chat offering a function tool
    mix_responses: float = 0.20  # OpenAI Responses API
    mix_anthropic: float = 0.20  # Anthropic messages, streamed, documents attached
    # -- traffic content
    related_context_rate: float = 0.7  # the context is about the query's topic
    chinese_rate: float = 0.3  # the query and its context are in Chinese
    stream_rate: float = 0.85  # share of JSON-mode and Responses requests that stream
    openai_model: str = "gpt-4o-mini"
    anthropic_model: str = "claude-3-5-haiku-latest"
    request_timeout_s: float = 30.0  # client-side limit for one whole request

    def __post_init__(self) -> None:
        rates = [name for name in self.__slots__ if name.endswith("_rate")]
        for name in rates:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"DemoProfile.{name} must be between 0 and 1")
        if not 0.0 < self.gap_min_s <= self.gap_max_s or self.stall_min_s > self.stall_max_s:
            raise ValueError(
                "DemoProfile: need 0 < gap_min_s <= gap_max_s, stall_min_s <= stall_max_s"
            )
        if self.ttft_median_s <= 0:
            raise ValueError("DemoProfile.ttft_median_s must be positive")


def demo_script(
    request: ScriptRequest, rng: random.Random, profile: DemoProfile | None = None
) -> Script:
    """A realistic randomised answer to ``request``, drawn from ``rng``.

    The text answers the query from the built-in corpus (a polite fallback when nothing
    matches); JSON or a tool call when the request asks for one; timing and failures per
    ``profile`` (default ``DemoProfile()``).
    """
    profile = profile or DemoProfile()
    body = request.json if isinstance(request.json, dict) else {}
    model = str(body.get("model") or "sim-demo")
    if rng.random() < profile.rate_limit_rate:
        headers = {"X-RateLimit-Source": "upstream", "retry-after": "1"}
        return Script(status=429, error="rate_limit_error", headers=headers, model=model)
    query = query_text(body)
    entry = best_entry(query)
    answer = entry.answer if entry else FALLBACK["zh" if has_cjk(query) else "en"]
    pieces, tool_call, finish = _demo_content(profile, body, answer, rng)
    count = len(pieces) + (len(tool_call.pieces) if tool_call else 0)
    return Script(
        pieces=pieces,
        tool_call=tool_call,
        finish_reason=finish,
        ttft_s=rng.lognormvariate(math.log(profile.ttft_median_s), profile.ttft_sigma),
        gaps_s=_demo_gaps(profile, count, rng),
        model=model,
    )


def _demo_content(
    profile: DemoProfile, body: Mapping[str, Any], answer: str, rng: random.Random
) -> tuple[tuple[str, ...], ToolScript | None, str]:
    """Pieces, tool call and finish reason: a tool call, JSON, or plain text, as asked."""
    tool = _requested_tool(body)
    if tool is not None:
        name, schema = tool
        arguments, finish = _structured_text(profile, schema, answer, rng)
        call = ToolScript(name=name, pieces=_split_json(arguments, rng))
        return (), call, "tool_calls" if finish == "stop" else finish
    wanted = _requested_schema(body)
    if wanted is not None:
        text, finish = _structured_text(profile, wanted, answer, rng)
        return _split_json(text, rng), None, finish
    return _split_text(answer, rng), None, "stop"


def _demo_gaps(profile: DemoProfile, count: int, rng: random.Random) -> tuple[float, ...]:
    typical = rng.uniform(profile.gap_min_s, profile.gap_max_s)
    gaps = [max(0.001, rng.gauss(typical, profile.gap_jitter_s)) for _ in range(count - 1)]
    if gaps and rng.random() < profile.stall_rate:
        gaps[rng.randrange(len(gaps))] = rng.uniform(profile.stall_min_s, profile.stall_max_s)
    return tuple(gaps)


def _split_text(text: str, rng: random.Random) -> tuple[str, ...]:
    """Token-like pieces: words with their trailing space, or 1-3 Chinese characters."""
    if has_cjk(text):
        pieces, i = [], 0
        while i < len(text):
            step = rng.randint(1, 3)
            pieces.append(text[i : i + step])
            i += step
        return tuple(pieces)
    return tuple(re.findall(r"\S+\s*", text))


def _split_json(text: str, rng: random.Random) -> tuple[str, ...]:
    pieces, i = [], 0
    while i < len(text):
        step = rng.randint(3, 8)
        pieces.append(text[i : i + step])
        i += step
    return tuple(pieces)


def _dict_at(obj: Any, key: str) -> dict[str, Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def _requested_schema(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON output the request asks for: its schema, ``{}`` for plain JSON mode, or None."""
    fmt = _dict_at(body, "response_format") or _dict_at(_dict_at(body, "text"), "format")
    if fmt.get("type") in ("json_object", "json_schema"):
        return _dict_at(_dict_at(fmt, "json_schema") or fmt, "schema")
    grammar = _dict_at(_dict_at(body, "parameters"), "grammar")  # TGI
    if grammar.get("type") == "json":
        return _dict_at(grammar, "value")
    ollama = body.get("format")
    if ollama == "json" or isinstance(ollama, dict):
        return ollama if isinstance(ollama, dict) else {}
    return None


def _requested_tool(body: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """Name and parameter schema of the first tool offered, unless tools are switched off."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    spec = _dict_at(tools[0], "function") or (tools[0] if isinstance(tools[0], dict) else {})
    name = spec.get("name")
    if not isinstance(name, str):
        return None
    return name, _dict_at(spec, "parameters") or _dict_at(spec, "input_schema")


def _structured_text(
    profile: DemoProfile, schema: dict[str, Any], answer: str, rng: random.Random
) -> tuple[str, str]:
    """JSON text for ``schema`` and its finish reason: mostly valid, sometimes broken."""
    value = _sample(schema, answer, rng, 0) if schema else {"answer": answer}
    roll = rng.random()
    if isinstance(value, dict) and roll < profile.schema_violation_rate:
        required = [k for k in schema.get("required", ()) if k in value]
        value.pop(rng.choice(required) if required else next(iter(value), ""), None)
    text = orjson.dumps(value).decode()
    roll = rng.random()
    if roll < profile.truncated_json_rate and len(text) > 4:
        return text[: rng.randint(len(text) // 3, len(text) * 4 // 5)], "length"
    if roll < profile.truncated_json_rate + profile.malformed_json_rate:
        broken = text[:-1] + ",}" if text.endswith("}") else text.replace('"', "", 1)
        return broken, "stop"
    return text, "stop"


def _sample(schema: Any, answer: str, rng: random.Random, depth: int) -> Any:
    """A value that fits the JSON Schema ``schema`` (the common keywords), built from ``answer``."""
    if not isinstance(schema, dict):
        return answer
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        if depth >= 4 or not isinstance(props, dict):
            return {}
        return {key: _sample(sub, answer, rng, depth + 1) for key, sub in props.items()}
    if kind == "array":
        return [
            _sample(schema.get("items"), answer, rng, depth + 1) for _ in range(rng.randint(1, 3))
        ]
    samples: dict[Any, Callable[[], Any]] = {
        "integer": lambda: rng.randint(1, 100),
        "number": lambda: round(rng.random(), 2),
        "boolean": lambda: rng.random() < 0.5,
        "null": lambda: None,
    }
    make = samples.get(kind)
    return make() if make else " ".join(answer.split()[: rng.randint(3, 12)])
