"""The request extractor against the conversation it was built from, for every provider.

A conversation (system text, user and assistant turns, text as a string or as content
parts) is written in each provider's request shape; the extractor must find the query
(the last user turn with text), the context (everything else with text, system first, in
order, chunked), the model, the stream flag and the token estimate, whatever the turns
hold: empty or blank text, CJK, newlines, paragraph breaks. tests/collectors/test_request.py
holds the never-raises properties over arbitrary bodies and the example-based tests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.config import Extract
from semhealth.collectors.request import chunk_text, estimate_tokens, extract_request
from tests.fuzz.budget import examples

LONG_CONTEXT = 60


@dataclass(frozen=True)
class Conversation:
    system: str | None
    turns: tuple[tuple[str, str, bool], ...]  # role, text, written as content parts
    stream: bool

    def query(self) -> str | None:
        texts = [text for role, text, _ in self.turns if role == "user" and has_text(text)]
        return texts[-1] if texts else None

    def context(self) -> list[str]:
        out = [self.system] if self.system is not None and has_text(self.system) else []
        query_at = max(
            (
                i
                for i, (role, text, _) in enumerate(self.turns)
                if role == "user" and has_text(text)
            ),
            default=None,
        )
        out += [t for i, (_, t, _) in enumerate(self.turns) if i != query_at and has_text(t)]
        return out


def has_text(text: str) -> bool:
    return text != "" and not text.isspace()


# Paragraph breaks, sentence ends and CJK in every mix: what chunking and estimates split on.
texts = st.lists(
    st.text(st.characters(codec="utf-8"), max_size=6)
    | st.sampled_from(["\n\n", ". ", "\u3002", "\u6587", " ", "\t", "\n"]),
    max_size=12,
).map("".join)
conversations = st.builds(
    Conversation,
    system=st.none() | texts,
    turns=st.lists(
        st.tuples(st.sampled_from(["user", "assistant"]), texts, st.booleans()), max_size=5
    ).map(tuple),
    stream=st.booleans(),
)


def content(text: str, as_parts: bool, part_type: str = "text") -> Any:
    return [{"type": part_type, "text": text}] if as_parts else text


def chat_messages(conv: Conversation) -> list[dict[str, Any]]:
    system = [] if conv.system is None else [{"role": "system", "content": conv.system}]
    return system + [{"role": r, "content": content(t, p)} for r, t, p in conv.turns]


def body_for(provider: str, conv: Conversation) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "m-1", "stream": conv.stream}
    if provider in ("openai_chat", "ollama"):
        return {**base, "messages": chat_messages(conv)}
    if provider == "anthropic_messages":
        turns = [{"role": r, "content": content(t, p)} for r, t, p in conv.turns]
        system = {} if conv.system is None else {"system": conv.system}
        return {**base, **system, "messages": turns}
    assert provider == "openai_responses"
    items = [{"role": r, "content": content(t, p, "input_text")} for r, t, p in conv.turns]
    system = {} if conv.system is None else {"instructions": conv.system}
    return {**base, **system, "input": items}


PROVIDERS = ("openai_chat", "ollama", "anthropic_messages", "openai_responses")


@examples(ci=150)
@given(
    conv=conversations,
    provider=st.sampled_from(PROVIDERS),
    indent=st.sampled_from([None, 1, 4]),
    chunk_chars=st.integers(1, 60),
)
def test_facts_are_the_conversations_in_every_provider_shape(
    conv: Conversation, provider: str, indent: int | None, chunk_chars: int
) -> None:
    doc = body_for(provider, conv)
    # The JSON's own layout (whitespace, escapes) never matters.
    raw = orjson.dumps(doc) if indent is None else json.dumps(doc, indent=indent).encode()
    facts, prompt_class = extract_request(
        raw, provider, Extract(), long_context_tokens=LONG_CONTEXT, chunk_chars=chunk_chars
    )
    query, context = conv.query(), conv.context()
    assert (facts.analysed, facts.skip_reason) == (True, None)
    assert (facts.model, facts.stream) == ("m-1", conv.stream)
    assert facts.query == query
    expected_chunks = [c for text in context for c in chunk_text(text, max_chars=chunk_chars)]
    assert list(facts.context) == expected_chunks
    assert all(0 < len(chunk) <= chunk_chars for chunk in facts.context)
    estimate = estimate_tokens(([query] if query is not None else []) + context)
    assert facts.input_tokens_estimate == estimate
    assert prompt_class == ("long_context" if estimate >= LONG_CONTEXT else "short")


@examples(ci=100)
@given(
    conv=conversations,
    provider=st.sampled_from(PROVIDERS),
    cut=st.integers(0, 10_000),
)
def test_a_request_cut_short_is_not_json_and_never_raises(
    conv: Conversation, provider: str, cut: int
) -> None:
    raw = orjson.dumps(body_for(provider, conv))
    cut = min(cut, len(raw) - 1)
    body = raw[:cut]
    facts, prompt_class = extract_request(body, provider, Extract(), long_context_tokens=10)
    empty = not body.strip()
    assert facts.skip_reason == ("empty" if empty else "not_json")
    assert not facts.analysed and facts.query is None and facts.context == ()
    # Unread, the body's size stands in for its text: 4 bytes a token, as for Latin text.
    estimate = 0 if empty else math.ceil(len(body) / 4)
    assert facts.input_tokens_estimate == estimate
    assert prompt_class == ("long_context" if estimate >= 10 else "short")
