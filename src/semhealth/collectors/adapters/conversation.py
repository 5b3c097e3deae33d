"""A request's conversation as every provider's reader finds it, and the small readers they
share.

Each provider module reads its own request bodies (``read_request``) into a ``Reading``: the
``Conversation`` (the user's query and the context the model was given) and the output
structures the request asks for. The convention every reader follows:

- the query is the text of the last user message that has text; a user message holding only
  tool results (or only images) is passed over;
- the context is everything else the model was given, in request order: system and developer
  text first, then earlier and later turns, tool results and documents.

Readers never raise on a body's shape: what is missing reads as absent, and a body without
the carrier its provider reads the conversation from is ``UNUSABLE``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from semhealth.collectors.record import StructureRequest

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True, slots=True)
class Turn:
    """One message, normalised: ``text`` may be the query; ``extras`` are always context."""

    role: str
    text: str | None
    extras: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Conversation:
    """What a provider's convention found; ``usable`` is False when its carrier was missing."""

    query: str | None
    context: tuple[str, ...]
    usable: bool


UNUSABLE = Conversation(query=None, context=(), usable=False)

Reading = tuple[Conversation, tuple[StructureRequest, ...]]
"""What a provider's reader found in one request body."""

RequestReader = Callable[[dict[str, Any]], Reading]


def split_turns(system: Iterable[str], turns: Iterable[Turn]) -> Conversation:
    """Pick the last user turn with real text as the query; everything else is context."""
    turns = list(turns)
    query_at = next(
        (
            i
            for i in range(len(turns) - 1, -1, -1)
            if turns[i].role == "user" and has_text(turns[i].text)
        ),
        None,
    )
    context = [text for text in system if has_text(text)]
    for i, turn in enumerate(turns):
        context.extend(extra for extra in turn.extras if has_text(extra))
        if i != query_at and turn.text is not None and has_text(turn.text):
            context.append(turn.text)
    query = turns[query_at].text if query_at is not None else None
    return Conversation(query=query, context=tuple(context), usable=True)


def text_of(content: object) -> str | None:
    """A string, or the text parts of a content-part list joined by newlines; None if no text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [
        part["text"]
        for part in dicts(content)
        if part.get("type") in _TEXT_PART_TYPES and isinstance(part.get("text"), str)
    ]
    return "\n".join(texts) if texts else None


def function_tools(tools: object) -> Iterator[StructureRequest]:
    """OpenAI-style ``tools[]`` (also Ollama's): ``{"type": "function", "function": {...}}``."""
    for tool in dicts(tools):
        function = tool.get("function")
        if isinstance(function, dict):
            yield schema_request("tool_input", function.get("parameters"), function.get("name"))


def schema_request(kind: str, schema: object, name: object) -> StructureRequest:
    return StructureRequest(
        kind,
        schema=schema if isinstance(schema, dict) else None,
        name=nonempty_str(name),
    )


def dicts(items: object) -> Iterator[dict[str, Any]]:
    """The objects in a JSON list, skipping anything else; nothing when it is not a list."""
    if isinstance(items, list):
        yield from (item for item in items if isinstance(item, dict))


def list_or_empty(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def dict_or_empty(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def nonempty_str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def opt(text: str | None) -> tuple[str, ...]:
    return (text,) if text is not None else ()


def has_text(text: str | None) -> bool:
    return text is not None and text != "" and not text.isspace()
