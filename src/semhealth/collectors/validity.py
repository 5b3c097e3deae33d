"""Output validity: one verdict for every output that had to be structured.

An output had to be structured when the request asked for JSON (JSON mode, a JSON Schema
in ``response_format`` / ``text.format``), when it is a tool call's arguments (checked
against that tool's ``parameters`` / ``input_schema``), or when the route has a contract.

Checks run in this order and the first that fails is the result:

1. ``truncated``: the JSON is incomplete and the output was cut: finish reason
   ``length`` / ``max_tokens``, or the stream ended without its end marker;
2. ``syntax``: the text is not one JSON document (``offset`` is the index, in characters of
   the decoded text, of the first character that could continue no valid document;
   ``len(text)`` for a finished output that ended inside a value);
3. ``schema``: the request's schema rejects the document;
4. ``contract``: the route's contract rejects it. A contract is itself a JSON Schema whose
   rules carry the semantics (``if``/``then``/``else``, ``dependentSchemas``, ``const``,
   ...), e.g. "risk_level is high exactly when amount > 1,000,000";
5. ``valid``.

``schema_error`` says the schema or contract could not be used: an unsupported ``$schema``
dialect, a schema its meta-schema rejects, a ``$ref`` that cannot be resolved locally. A
remote ``$ref`` is never fetched: the retrieve hook refuses every URI, so such a schema is
a ``schema_error`` and is logged once per route, naming the route and the reason.

``reasons`` hold JSON Schema keywords (``required``, ``type``, ...) or short classes
(``length``, ``invalid_escape``, ``remote_ref``, ...), never instance values, and no text
from the output. Validators are compiled once per schema and kept in a bounded LRU keyed
by the SHA-256 of the schema's canonical JSON, so equal schemas share one validator.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import (  # type: ignore[import-untyped]
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from jsonschema_specifications import REGISTRY as SPECIFICATIONS  # type: ignore[import-untyped]

from semhealth.collectors.json_check import JSONChecker
from semhealth.collectors.record import (
    StreamRecord,
    StructureRequest,
    ToolCall,
    ValidityKind,
    ValidityResult,
)

Schema = dict[str, Any] | bool

TRUNCATING_FINISH_REASONS = frozenset({"length", "max_tokens"})
# Validation errors looked at per output: enough to name every failing keyword in practice,
# bounded so that a huge array of bad items costs no more than a few of them.
MAX_VALIDATION_ERRORS = 64
DEFAULT_CACHE_SIZE = 256

# Schema problems (``reasons`` of a ``schema_error``).
UNSUPPORTED_DIALECT = "unsupported_dialect"
INVALID_SCHEMA = "invalid_schema"
UNSERIALISABLE_SCHEMA = "unserialisable_schema"
REMOTE_REF = "remote_ref"
UNRESOLVABLE_REF = "unresolvable_ref"
VALIDATION_FAILED = "validation_failed"
# Reasons of ``truncated``, of syntax failures the checker does not name, of unknown tools.
CUT_AT_LENGTH = "length"
ENDED_EARLY = "ended_early"
UNEXPECTED_END = "unexpected_end"
REJECTED_BY_PARSER = "rejected_by_parser"
UNKNOWN_TOOL = "unknown_tool"

_PROBLEM_TEXT = {
    UNSUPPORTED_DIALECT: "its $schema is not draft-07, 2019-09 or 2020-12",
    INVALID_SCHEMA: "its meta-schema rejects it",
    UNSERIALISABLE_SCHEMA: "it is not JSON",
    REMOTE_REF: "it has a $ref to another document, and semhealth never fetches one",
    UNRESOLVABLE_REF: "it has a $ref that points nowhere in the schema",
    VALIDATION_FAILED: "validating with it failed",
}
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
_JSON_KINDS = ("json_object", "json_schema")


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """A schema ready to validate with, or why it cannot be used (``problem``)."""

    key: str  # SHA-256 of the schema's canonical JSON; "" when it has none
    validator: Any = None  # a jsonschema Validator; None exactly when ``problem`` is set
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class _Dialect:
    validator: Any  # a jsonschema Validator class
    specification: referencing.Specification[Any]


# ``$schema`` without scheme and trailing "#": draft-07 is written with http, the later
# drafts with https, and both forms occur in the wild.
_DIALECTS = {
    "json-schema.org/draft-07/schema": _Dialect(Draft7Validator, referencing.jsonschema.DRAFT7),
    "json-schema.org/draft/2019-09/schema": _Dialect(
        Draft201909Validator, referencing.jsonschema.DRAFT201909
    ),
    "json-schema.org/draft/2020-12/schema": _Dialect(
        Draft202012Validator, referencing.jsonschema.DRAFT202012
    ),
}
_DEFAULT_DIALECT = _DIALECTS["json-schema.org/draft/2020-12/schema"]


class _RemoteRefRefused(LookupError):
    """Raised by the retrieve hook: semhealth never fetches a schema."""


class SchemaCache:
    """Validators compiled once per schema, in a bounded LRU keyed by the schema's hash.

    ``check_formats`` turns on ``format`` assertions (``date-time``, ``email``, ...). It is
    off by default, as JSON Schema itself makes ``format`` an annotation, and providers'
    structured-output modes do not enforce it either. Thread-safe, so one cache may serve
    every collector of a process (``StreamCollector`` shares one unless given its own).
    """

    def __init__(
        self,
        size: int = DEFAULT_CACHE_SIZE,
        *,
        check_formats: bool = False,
        logger: logging.Logger | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self._size = size
        self._check_formats = check_formats
        self._log = logger if logger is not None else logging.getLogger(__name__)
        self._entries: OrderedDict[str, CompiledSchema] = OrderedDict()
        self._logged: set[tuple[str, str, str]] = set()  # (route, role, key) already logged
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, schema: Schema) -> CompiledSchema:
        """The compiled form of ``schema``: from the cache when an equal one was seen."""
        key = schema_key(schema)
        if key is None:
            return CompiledSchema(key="", problem=UNSERIALISABLE_SCHEMA)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self.hits += 1
                self._entries.move_to_end(key)
                return entry
            self.misses += 1
        # Compiled outside the lock: another thread may compile the same schema meanwhile,
        # and the entry stored last wins; both are equal.
        entry = _compile(schema, key, self._check_formats)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            if len(self._entries) > self._size:
                evicted, _ = self._entries.popitem(last=False)
                self._logged = {seen for seen in self._logged if seen[2] != evicted}
        return entry

    def log_unusable(self, compiled: CompiledSchema, *, route: str, role: str, target: str) -> None:
        """Log, once per route and schema, that a schema or contract cannot be used."""
        seen = (route, role, compiled.key)
        with self._lock:
            if seen in self._logged:
                return
            self._logged.add(seen)
        problem = compiled.problem or VALIDATION_FAILED
        self._log.warning(
            "route %r: the %s for %s cannot be used: %s (%s, schema sha256 %s); "
            "its outputs are counted as schema_error",
            route,
            role,
            target,
            _PROBLEM_TEXT.get(problem, problem),
            problem,
            compiled.key[:12] or "-",
        )


def schema_key(schema: Schema) -> str | None:
    """SHA-256 of the schema's canonical JSON (sorted keys); None if it is not JSON."""
    try:
        canonical = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: a non-JSON value or a non-string key
        return None
    return hashlib.sha256(canonical).hexdigest()


def check_output(
    text: str,
    *,
    schema: Schema | None,
    finish_reason: str | None,
    done: bool,
    contract: Schema | None,
    cache: SchemaCache,
    checker: JSONChecker | None = None,
    target: str = "content",
    route: str = "",
) -> ValidityResult:
    """The verdict on one output ``text``. Never raises on bad text or a bad schema.

    ``checker`` may be one already fed with ``text`` while it streamed (it is ignored if it
    saw a different amount of text). ``done``: the stream's end marker was seen.
    """
    if checker is None or checker.consumed != len(text):
        checker = JSONChecker()
        checker.feed(text)
    failure = _syntax_failure(checker, len(text), finish_reason=finish_reason, done=done)
    if failure is not None:
        return ValidityResult(failure.result, target, failure.reasons, failure.offset)
    try:
        instance = orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # the checker accepts only what orjson does
        return ValidityResult("syntax", target, (REJECTED_BY_PARSER,), exc.pos)
    for role, rules in (("schema", schema), ("contract", contract)):
        if rules is None:
            continue
        compiled = cache.get(rules)
        verdict = _validate(compiled, instance, role)
        if verdict is not None:
            if verdict.result == "schema_error":
                cache.log_unusable(compiled, route=route, role=role, target=target)
            return ValidityResult(verdict.result, target, verdict.reasons)
    return ValidityResult("valid", target)


def validate_record(
    record: StreamRecord, *, contract: Schema | None, cache: SchemaCache
) -> list[ValidityResult]:
    """One result per structured output of ``record``; [] when nothing had to be structured.

    The content is checked when the request asked for JSON or the route has a contract,
    unless the model answered with tool calls only. Each tool call is checked against
    the schema of the declared tool with its name. Records whose text is not the model's
    whole output are left out: an error response, an exchange the client left before its
    end, a stream the tap shed chunks of, or one whose analysis stopped at
    ``max_response_bytes``.
    """
    if record.status >= 400 or record.client_aborted or record.shed or record.truncated:
        return []
    structure = record.request.structure
    results: list[ValidityResult] = []
    content = next((s for s in structure if s.kind in _JSON_KINDS), None)
    answered_by_tools = bool(record.tool_calls) and not record.output_text.strip()
    if (content is not None or contract is not None) and not answered_by_tools:
        results.append(
            check_output(
                record.output_text,
                schema=content.schema if content is not None else None,
                finish_reason=record.finish_reason,
                done=record.done,
                contract=contract,
                cache=cache,
                route=record.route,
            )
        )
    if record.request.analysed:  # otherwise which tools were declared is unknown
        tools = {s.name: s for s in structure if s.kind == "tool_input" and s.name}
        results.extend(_check_tool_call(call, tools, record, cache) for call in record.tool_calls)
    return results


def _check_tool_call(
    call: ToolCall, tools: Mapping[str, StructureRequest], record: StreamRecord, cache: SchemaCache
) -> ValidityResult:
    tool = tools.get(call.name) if call.name is not None else None
    arguments = call.arguments
    if (
        not arguments.strip()
        and record.done
        and record.finish_reason not in TRUNCATING_FINISH_REASONS
    ):
        arguments = "{}"  # Anthropic streams no input_json_delta for a tool without input
    result = check_output(
        arguments,
        schema=tool.schema if tool is not None else None,
        finish_reason=record.finish_reason,
        done=record.done,
        contract=None,
        cache=cache,
        target=f"tool:{call.name}" if tool is not None else "tool",
        route=record.route,
    )
    if tool is None and result.result == "valid":
        return ValidityResult("schema", "tool", (UNKNOWN_TOOL,))
    return result


def _syntax_failure(
    checker: JSONChecker, length: int, *, finish_reason: str | None, done: bool
) -> ValidityResult | None:
    verdict = checker.finish()
    if verdict == "valid":
        return None
    if verdict == "syntax":
        reason = checker.error_reason or UNEXPECTED_END
        return ValidityResult("syntax", reasons=(reason,), offset=checker.error_offset)
    if finish_reason in TRUNCATING_FINISH_REASONS:
        return ValidityResult("truncated", reasons=(CUT_AT_LENGTH,))
    if not done:
        return ValidityResult("truncated", reasons=(ENDED_EARLY,))
    return ValidityResult("syntax", reasons=(UNEXPECTED_END,), offset=length)


def _validate(compiled: CompiledSchema, instance: Any, role: str) -> ValidityResult | None:
    """None when ``instance`` passes; else a ``schema``/``contract`` or ``schema_error`` result."""
    if compiled.problem is not None:
        return ValidityResult("schema_error", reasons=(compiled.problem,))
    keywords: set[str] = set()
    try:
        for count, error in enumerate(compiled.validator.iter_errors(instance), start=1):
            # A bare ``false`` subschema fails with no keyword of its own.
            keywords.add(error.validator if isinstance(error.validator, str) else "false")
            if count >= MAX_VALIDATION_ERRORS:
                break
    except referencing.exceptions.Unresolvable:
        return ValidityResult("schema_error", reasons=(UNRESOLVABLE_REF,))
    except (RecursionError, ValueError, TypeError, re.error):
        # A schema the meta-schema accepts can still fail while validating (a pattern the
        # regex engine rejects, an instance nested past the recursion limit); it comes from
        # the request, so nothing it causes may escape.
        return ValidityResult("schema_error", reasons=(VALIDATION_FAILED,))
    if not keywords:
        return None
    kind: ValidityKind = "contract" if role == "contract" else "schema"
    return ValidityResult(kind, reasons=tuple(sorted(keywords)))


def _compile(schema: Schema, key: str, check_formats: bool) -> CompiledSchema:
    dialect = _dialect_of(schema)
    if dialect is None:
        return CompiledSchema(key=key, problem=UNSUPPORTED_DIALECT)
    try:
        dialect.validator.check_schema(schema)
    except (SchemaError, RecursionError):
        return CompiledSchema(key=key, problem=INVALID_SCHEMA)
    attempted: list[str] = []
    registry: referencing.Registry[Any] = referencing.Registry(
        retrieve=_refusing_retrieve(attempted)  # type: ignore[call-arg]
    )
    problem = _ref_problem(schema, dialect.specification, registry, attempted)
    if problem is not None:
        return CompiledSchema(key=key, problem=problem)
    format_checker = dialect.validator.FORMAT_CHECKER if check_formats else None
    validator = dialect.validator(schema, registry=registry, format_checker=format_checker)
    return CompiledSchema(key=key, validator=validator)


def _dialect_of(schema: Schema) -> _Dialect | None:
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if declared is None:
        return _DEFAULT_DIALECT
    if not isinstance(declared, str):
        return None
    bare = declared.split("://", 1)[-1].rstrip("#")
    return _DIALECTS.get(bare)


def _refusing_retrieve(attempted: list[str]) -> Any:
    def retrieve(uri: str) -> referencing.Resource[Any]:
        attempted.append(uri)
        raise _RemoteRefRefused(uri)

    return retrieve


def _ref_problem(
    schema: Schema,
    specification: referencing.Specification[Any],
    registry: referencing.Registry[Any],
    attempted: list[str],
) -> str | None:
    """Resolve every reference of the schema now, so that one needing a remote document
    (or pointing nowhere) is a ``schema_error`` for every output, not only for those whose
    validation happens to reach it."""
    root = specification.create_resource(schema)
    stack = [(SPECIFICATIONS.combine(registry).resolver_with_root(root), root)]
    while stack:
        resolver, resource = stack.pop()
        contents = resource.contents
        if isinstance(contents, Mapping):
            for keyword in _REF_KEYWORDS:
                ref = contents.get(keyword)
                if not isinstance(ref, str):
                    continue
                try:
                    resolver.lookup(ref)
                except referencing.exceptions.Unresolvable:
                    return REMOTE_REF if attempted else UNRESOLVABLE_REF
        stack.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())
    return None
