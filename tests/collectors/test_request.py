# Chinese test text uses fullwidth punctuation on purpose: it is what the splitter must handle.
# ruff: noqa: RUF001
from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semhealth.collectors.config import PROVIDERS, Extract
from semhealth.collectors.jsonpath import validate_jsonpath
from semhealth.collectors.record import RequestFacts, StructureRequest
from semhealth.collectors.request import (
    CHUNK_CHARS,
    chunk_text,
    estimate_tokens,
    extract_request,
    unanalysed,
)

CONCRETE_PROVIDERS = tuple(p for p in PROVIDERS if p != "auto")
NO_OVERRIDE = Extract()
THRESHOLD = 4000

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}


def facts_of(
    body: dict[str, Any] | list[Any] | str,
    provider: str,
    extract: Extract = NO_OVERRIDE,
    **kwargs: Any,
) -> RequestFacts:
    facts, _ = extract_request(
        orjson.dumps(body), provider, extract, long_context_tokens=THRESHOLD, **kwargs
    )
    return facts


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- OpenAI chat completions ------------------------------------------------------------------

CHAT_BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "stream": True,
    "messages": [
        {"role": "system", "content": "You are a travel assistant."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in one sentence."}]},
        {"role": "user", "content": "I am going to Lisbon."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Lisbon"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Lisbon: 24 C, sunny."},
        {"role": "assistant", "content": "Lisbon is sunny today."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What should I pack?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "I have a small bag."},
            ],
        },
    ],
}


def test_openai_chat_query_is_last_user_message_with_text_parts_joined() -> None:
    facts = facts_of(CHAT_BODY, "openai_chat")
    assert facts.query == "What should I pack?\nI have a small bag."


def test_openai_chat_context_is_system_then_turns_and_tool_results_in_order() -> None:
    facts = facts_of(CHAT_BODY, "openai_chat")
    assert facts.context == (
        "You are a travel assistant.",
        "Answer in one sentence.",
        "I am going to Lisbon.",
        "Lisbon: 24 C, sunny.",
        "Lisbon is sunny today.",
    )


def test_openai_chat_reads_model_and_stream() -> None:
    facts = facts_of(CHAT_BODY, "openai_chat")
    assert (facts.model, facts.stream, facts.analysed, facts.skip_reason) == (
        "gpt-4o-mini",
        True,
        True,
        None,
    )


def test_openai_chat_stream_defaults_to_false() -> None:
    facts = facts_of({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "openai_chat")
    assert facts.stream is False


def test_openai_chat_image_only_user_message_is_not_the_query() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Describe the next picture."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        ]
    }
    assert facts_of(body, "openai_chat").query == "Describe the next picture."


def test_openai_chat_without_user_text_has_no_query() -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."}]}
    facts = facts_of(body, "openai_chat")
    assert (facts.query, facts.context, facts.analysed) == (None, ("Be brief.",), True)


def test_openai_chat_json_object_response_format() -> None:
    body = {**CHAT_BODY, "response_format": {"type": "json_object"}}
    assert facts_of(body, "openai_chat").structure == (StructureRequest("json_object"),)


def test_openai_chat_json_schema_response_format() -> None:
    body = {
        **CHAT_BODY,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True},
        },
    }
    assert facts_of(body, "openai_chat").structure == (
        StructureRequest("json_schema", WEATHER_SCHEMA, "weather"),
    )


def test_openai_chat_text_response_format_asks_no_structure() -> None:
    body = {**CHAT_BODY, "response_format": {"type": "text"}}
    assert facts_of(body, "openai_chat").structure == ()


def test_openai_chat_tools_become_one_tool_input_each() -> None:
    body = {
        **CHAT_BODY,
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": True},
            },
            {"type": "function", "function": {"name": "now"}},
        ],
    }
    assert facts_of(body, "openai_chat").structure == (
        StructureRequest("tool_input", WEATHER_SCHEMA, "get_weather"),
        StructureRequest("tool_input", None, "now"),
    )


def test_openai_chat_legacy_functions_become_tool_inputs() -> None:
    body = {**CHAT_BODY, "functions": [{"name": "get_weather", "parameters": WEATHER_SCHEMA}]}
    assert facts_of(body, "openai_chat").structure == (
        StructureRequest("tool_input", WEATHER_SCHEMA, "get_weather"),
    )


# --- OpenAI responses -------------------------------------------------------------------------


def test_responses_string_input_is_the_query_and_instructions_the_context() -> None:
    body = {"model": "gpt-4.1", "instructions": "Talk like a pirate.", "input": "Hello there"}
    facts = facts_of(body, "openai_responses")
    assert (facts.query, facts.context) == ("Hello there", ("Talk like a pirate.",))


def test_responses_item_list_query_and_context() -> None:
    body = {
        "model": "gpt-4.1",
        "stream": True,
        "input": [
            {"role": "developer", "content": "Use metric units."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Oslo?"}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city":"Oslo"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "Oslo: -3 C, snow."},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "It is snowing in Oslo."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "And tomorrow?"},
                    {"type": "input_image", "image_url": "https://example.com/a.png"},
                ],
            },
        ],
    }
    facts = facts_of(body, "openai_responses")
    assert (facts.query, facts.context, facts.stream) == (
        "And tomorrow?",
        ("Use metric units.", "Weather in Oslo?", "Oslo: -3 C, snow.", "It is snowing in Oslo."),
        True,
    )


def test_responses_text_format_json_schema() -> None:
    body = {
        "input": "Weather?",
        "text": {
            "format": {
                "type": "json_schema",
                "name": "weather",
                "schema": WEATHER_SCHEMA,
                "strict": True,
            }
        },
    }
    assert facts_of(body, "openai_responses").structure == (
        StructureRequest("json_schema", WEATHER_SCHEMA, "weather"),
    )


def test_responses_text_format_json_object() -> None:
    body = {"input": "Weather?", "text": {"format": {"type": "json_object"}}}
    assert facts_of(body, "openai_responses").structure == (StructureRequest("json_object"),)


def test_responses_function_tools_only_become_tool_inputs() -> None:
    body = {
        "input": "Weather?",
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA},
            {"type": "web_search_preview"},
        ],
    }
    assert facts_of(body, "openai_responses").structure == (
        StructureRequest("tool_input", WEATHER_SCHEMA, "get_weather"),
    )


# --- Anthropic messages -----------------------------------------------------------------------

ANTHROPIC_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "stream": True,
    "system": [
        {"type": "text", "text": "You answer questions about contracts."},
        {"type": "text", "text": "Quote clauses.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "Clause 1."},
                },
                {
                    "type": "document",
                    "source": {"type": "content", "content": [{"type": "text", "text": "Annex."}]},
                },
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                },
                {"type": "text", "text": "When can I terminate?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look up the notice period."},
                {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"clause": 7}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": "Notice: 30 days."},
                {
                    "type": "tool_result",
                    "tool_use_id": "tu_2",
                    "content": [{"type": "text", "text": "Penalty: none."}],
                },
            ],
        },
    ],
}


def test_anthropic_tool_result_only_message_is_not_the_query() -> None:
    assert facts_of(ANTHROPIC_BODY, "anthropic_messages").query == "When can I terminate?"


def test_anthropic_context_has_system_blocks_documents_turns_and_tool_results() -> None:
    facts = facts_of(ANTHROPIC_BODY, "anthropic_messages")
    assert facts.context == (
        "You answer questions about contracts.\nQuote clauses.",
        "Clause 1.",
        "Annex.",
        "Let me look up the notice period.",
        "Notice: 30 days.",
        "Penalty: none.",
    )


def test_anthropic_system_string_and_string_content() -> None:
    body = {
        "model": "claude-haiku-4-5",
        "system": "Be terse.",
        "messages": [{"role": "user", "content": "Hi"}],
    }
    facts = facts_of(body, "anthropic_messages")
    assert (facts.model, facts.query, facts.context, facts.stream) == (
        "claude-haiku-4-5",
        "Hi",
        ("Be terse.",),
        False,
    )


def test_anthropic_client_tools_become_tool_inputs_and_server_tools_do_not() -> None:
    body = {
        **ANTHROPIC_BODY,
        "tools": [
            {"name": "lookup", "description": "Find a clause", "input_schema": WEATHER_SCHEMA},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ],
    }
    assert facts_of(body, "anthropic_messages").structure == (
        StructureRequest("tool_input", WEATHER_SCHEMA, "lookup"),
    )


# --- Ollama and TGI ---------------------------------------------------------------------------


def test_ollama_chat_messages_and_default_streaming() -> None:
    body = {
        "model": "llama3.2",
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Why is the sky blue?", "images": ["AAAA"]},
        ],
    }
    facts = facts_of(body, "ollama")
    assert (facts.model, facts.query, facts.context, facts.stream) == (
        "llama3.2",
        "Why is the sky blue?",
        ("Be kind.",),
        True,
    )


def test_ollama_stream_false_is_respected() -> None:
    body = {"model": "llama3.2", "prompt": "Hi", "stream": False}
    assert facts_of(body, "ollama").stream is False


def test_ollama_generate_prompt_is_query_and_system_is_context() -> None:
    body = {"model": "llama3.2", "prompt": "Name a colour.", "system": "One word only."}
    facts = facts_of(body, "ollama")
    assert (facts.query, facts.context) == ("Name a colour.", ("One word only.",))


def test_ollama_format_json_is_json_object() -> None:
    body = {"model": "llama3.2", "prompt": "Hi", "format": "json"}
    assert facts_of(body, "ollama").structure == (StructureRequest("json_object"),)


def test_ollama_format_schema_is_json_schema() -> None:
    body = {"model": "llama3.2", "prompt": "Hi", "format": WEATHER_SCHEMA}
    assert facts_of(body, "ollama").structure == (StructureRequest("json_schema", WEATHER_SCHEMA),)


def test_tgi_inputs_is_query_without_model() -> None:
    body = {"inputs": "What is deep learning?", "parameters": {"max_new_tokens": 20}}
    facts = facts_of(body, "tgi")
    assert (facts.model, facts.query, facts.context, facts.stream) == (
        None,
        "What is deep learning?",
        (),
        False,
    )


def test_tgi_stream_comes_from_body_when_present() -> None:
    assert facts_of({"inputs": "Hi", "stream": True}, "tgi").stream is True


def test_tgi_json_grammar_is_json_schema() -> None:
    body = {"inputs": "Hi", "parameters": {"grammar": {"type": "json", "value": WEATHER_SCHEMA}}}
    assert facts_of(body, "tgi").structure == (StructureRequest("json_schema", WEATHER_SCHEMA),)


# --- token estimate and prompt class ----------------------------------------------------------


def test_estimate_counts_each_cjk_character_as_one_token() -> None:
    assert estimate_tokens(["深度学习是什么", "ひらがなカタカナ", "한국어"]) == 7 + 8 + 3


def test_estimate_counts_other_characters_four_to_a_token_rounded_up() -> None:
    assert estimate_tokens(["abcd", "efghi"]) == 3


def test_estimate_covers_query_and_context() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "abcd"},
            {"role": "user", "content": "请回答"},
        ]
    }
    assert facts_of(body, "openai_chat").input_tokens_estimate == 1 + 3


def test_prompt_class_is_long_context_at_the_threshold() -> None:
    body = orjson.dumps({"messages": [{"role": "user", "content": "文" * 100}]})
    _, at = extract_request(body, "openai_chat", NO_OVERRIDE, long_context_tokens=100)
    _, above = extract_request(body, "openai_chat", NO_OVERRIDE, long_context_tokens=101)
    assert (at, above) == ("long_context", "short")


# --- chunking ---------------------------------------------------------------------------------


def test_short_text_is_one_chunk() -> None:
    assert chunk_text("  One paragraph.  ") == ["One paragraph."]


def test_small_paragraphs_are_packed_together() -> None:
    assert chunk_text("First.\n\nSecond.\n\n\nThird.", max_chars=20) == [
        "First.\n\nSecond.",
        "Third.",
    ]


def test_long_paragraph_splits_at_sentence_ends() -> None:
    text = "Alpha beta gamma. Delta epsilon! Zeta eta theta? Iota."
    assert chunk_text(text, max_chars=20) == [
        "Alpha beta gamma.",
        "Delta epsilon!",
        "Zeta eta theta?",
        "Iota.",
    ]


def test_long_chinese_paragraph_splits_at_full_stops() -> None:
    text = "今天天气很好。我们去公园吧！你想去吗？好的。"
    assert chunk_text(text, max_chars=8) == ["今天天气很好。", "我们去公园吧！", "你想去吗？好的。"]


def test_sentence_longer_than_limit_is_cut_hard() -> None:
    assert chunk_text("x" * 25, max_chars=10) == ["x" * 10, "x" * 10, "x" * 5]


def test_default_chunk_size_is_a_thousand_characters() -> None:
    chunks = chunk_text(("word " * 199 + "end. ") * 3)
    assert CHUNK_CHARS == 1000
    assert [len(c) for c in chunks] == [1000 - 1, 1000 - 1, 1000 - 1]


def test_chunk_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        chunk_text("abc", max_chars=0)


def test_extract_request_chunks_context_with_the_given_size() -> None:
    body = {"system": "Aa. Bb. Cc.", "messages": [{"role": "user", "content": "Q"}]}
    facts = facts_of(body, "anthropic_messages", chunk_chars=4)
    assert facts.context == ("Aa.", "Bb.", "Cc.")


@given(st.text(alphabet=st.sampled_from("ab 。！？.!?\n\t文字"), max_size=400), st.integers(1, 50))
def test_chunks_never_exceed_the_limit(text: str, limit: int) -> None:
    assert all(0 < len(chunk) <= limit for chunk in chunk_text(text, max_chars=limit))


@given(st.text(max_size=400), st.integers(1, 50))
def test_chunks_keep_every_non_whitespace_character_in_order(text: str, limit: int) -> None:
    assert squash("".join(chunk_text(text, max_chars=limit))) == squash(text)


# --- route overrides --------------------------------------------------------------------------

CUSTOM_BODY: dict[str, Any] = {
    "model": "in-house-rag",
    "question": {"text": "Where is the invoice?"},
    "retrieved": [{"passage": "Invoices live in /billing."}, {"passage": ["Ask", "finance."]}],
    "history": [["Hello", ["again", 3]], None],
}


def test_query_override_takes_the_first_match() -> None:
    extract = Extract(query="$.retrieved[*].passage")
    assert facts_of(CUSTOM_BODY, "openai_chat", extract).query == "Invoices live in /billing."


def test_query_override_joins_a_list_of_strings_with_newlines() -> None:
    extract = Extract(query="$.retrieved[1].passage")
    assert facts_of(CUSTOM_BODY, "openai_chat", extract).query == "Ask\nfinance."


def test_query_override_without_match_gives_no_query() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert facts_of(body, "openai_chat", Extract(query="$.nothing")).query is None


def test_context_override_flattens_lists_and_keeps_only_strings() -> None:
    extract = Extract(query="$.question.text", context=("$.retrieved[*].passage", "$.history"))
    facts = facts_of(CUSTOM_BODY, "openai_chat", extract)
    assert (facts.query, facts.context, facts.analysed) == (
        "Where is the invoice?",
        ("Invoices live in /billing.", "Ask", "finance.", "Hello", "again"),
        True,
    )


def test_context_override_replaces_only_the_context() -> None:
    body = {**CHAT_BODY, "notes": "Passport expires soon."}
    facts = facts_of(body, "openai_chat", Extract(context=("$.notes",)))
    assert (facts.query, facts.context) == (
        "What should I pack?\nI have a small bag.",
        ("Passport expires soon.",),
    )


def test_query_override_alone_leaves_missing_carrier_a_shape_problem() -> None:
    facts = facts_of(CUSTOM_BODY, "openai_chat", Extract(query="$.question.text"))
    assert (facts.query, facts.skip_reason) == ("Where is the invoice?", "shape")


def test_invalid_override_at_run_time_matches_nothing() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    facts = facts_of(body, "openai_chat", Extract(query="$[[", context=("$.(",)))
    assert (facts.query, facts.context, facts.analysed) == (None, (), True)


def test_override_filter_on_mixed_types_does_not_raise() -> None:
    body = {"docs": [{"score": "high", "t": "a"}, {"score": 2, "t": "b"}]}
    facts = facts_of(body, "tgi", Extract(query="$.docs[?(@.score > 1)].t"))
    assert facts.query == "b"


def test_validate_jsonpath_accepts_a_valid_expression() -> None:
    assert validate_jsonpath("$.messages[?(@.role == 'user')].content") is None


def test_validate_jsonpath_names_the_invalid_expression() -> None:
    message = validate_jsonpath("$.messages[")
    assert message is not None
    assert message.startswith("invalid JSONPath expression '$.messages[': ")


# --- skip reasons -----------------------------------------------------------------------------


def test_empty_body_is_skipped_as_empty() -> None:
    facts, prompt_class = extract_request(b"", "openai_chat", NO_OVERRIDE, long_context_tokens=10)
    assert (facts, prompt_class) == (RequestFacts(analysed=False, skip_reason="empty"), "short")


def test_whitespace_body_is_skipped_as_empty() -> None:
    facts, _ = extract_request(b" \r\n", "ollama", NO_OVERRIDE, long_context_tokens=10)
    assert facts.skip_reason == "empty"


def test_non_json_body_is_skipped_as_not_json() -> None:
    facts, _ = extract_request(b"prompt=hi", "tgi", NO_OVERRIDE, long_context_tokens=10)
    assert (facts.analysed, facts.skip_reason, facts.query) == (False, "not_json", None)


def test_invalid_utf8_body_is_skipped_as_not_json() -> None:
    facts, _ = extract_request(b'{"inputs": "\xff"}', "tgi", NO_OVERRIDE, long_context_tokens=10)
    assert facts.skip_reason == "not_json"


def test_json_array_body_is_a_shape_problem() -> None:
    facts = facts_of([{"role": "user", "content": "hi"}], "openai_chat")
    assert (facts.analysed, facts.skip_reason, facts.query) == (False, "shape", None)


def test_non_object_body_still_yields_override_matches() -> None:
    facts = facts_of(["first", "second"], "tgi", Extract(query="$[1]", context=("$[0]",)))
    assert (facts.query, facts.context, facts.skip_reason) == ("second", ("first",), "shape")


def test_missing_carrier_is_a_shape_problem_with_the_rest_filled() -> None:
    body = {"model": "gpt-4o", "stream": True, "response_format": {"type": "json_object"}}
    facts = facts_of(body, "openai_chat")
    assert facts == RequestFacts(
        model="gpt-4o",
        stream=True,
        structure=(StructureRequest("json_object"),),
        analysed=False,
        skip_reason="shape",
    )


def test_unknown_provider_is_a_shape_problem() -> None:
    facts = facts_of({"model": "m", "messages": []}, "auto")
    assert (facts.model, facts.skip_reason) == ("m", "shape")


def test_unanalysed_defaults_to_short() -> None:
    assert unanalysed("oversized") == (
        RequestFacts(analysed=False, skip_reason="oversized"),
        "short",
    )


def test_unanalysed_oversized_body_estimates_from_its_size() -> None:
    facts, prompt_class = unanalysed("oversized", body_bytes=2 << 20, long_context_tokens=4000)
    assert (facts.input_tokens_estimate, prompt_class) == (1 << 19, "long_context")


# --- never raises -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)

VOCABULARY = [
    "model",
    "stream",
    "messages",
    "input",
    "instructions",
    "system",
    "prompt",
    "inputs",
    "role",
    "content",
    "type",
    "text",
    "user",
    "assistant",
    "tool",
    "developer",
    "tools",
    "function",
    "parameters",
    "name",
    "input_schema",
    "response_format",
    "json_schema",
    "json_object",
    "schema",
    "format",
    "output",
    "source",
    "data",
    "grammar",
    "value",
    "tool_result",
    "document",
    "input_text",
    "function_call_output",
    "message",
    "json",
]

vocab_strings = st.sampled_from(VOCABULARY) | st.text(max_size=6)
shaped_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | vocab_strings,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(VOCABULARY), children, max_size=5)
    ),
    max_leaves=40,
)

overrides = st.sampled_from(
    [NO_OVERRIDE, Extract(query="$..text", context=("$..content", "$..data", "$[*]"))]
)


def assert_well_formed(facts: RequestFacts, prompt_class: str) -> None:
    assert prompt_class in {"short", "long_context"}
    assert facts.analysed == (facts.skip_reason is None)
    assert all(isinstance(chunk, str) and chunk for chunk in facts.context)
    assert facts.query is None or isinstance(facts.query, str)


@given(st.binary(max_size=200), st.sampled_from(PROVIDERS))
def test_arbitrary_bytes_never_raise(body: bytes, provider: str) -> None:
    assert_well_formed(*extract_request(body, provider, NO_OVERRIDE, long_context_tokens=50))


@given(json_values, st.sampled_from(CONCRETE_PROVIDERS), overrides)
def test_arbitrary_json_never_raises(value: Any, provider: str, extract: Extract) -> None:
    body = orjson.dumps(value)
    assert_well_formed(*extract_request(body, provider, extract, long_context_tokens=50))


@given(shaped_values, st.sampled_from(CONCRETE_PROVIDERS), overrides)
def test_provider_shaped_json_never_raises(value: Any, provider: str, extract: Extract) -> None:
    body = orjson.dumps(value)
    assert_well_formed(*extract_request(body, provider, extract, long_context_tokens=50))


def test_deeply_nested_body_with_recursive_override_does_not_raise() -> None:
    body = b"[" * 1000 + b"]" * 1000
    facts, _ = extract_request(
        body, "tgi", Extract(query="$..*", context=("$",)), long_context_tokens=10
    )
    assert (facts.query, facts.skip_reason) == (None, "shape")


def test_openai_completions_prompt_is_the_query() -> None:
    body = orjson.dumps({"model": "gpt-3.5-turbo-instruct", "prompt": "Say hi", "stream": True})
    facts, _ = extract_request(body, "openai_completions", Extract(), long_context_tokens=4000)
    assert facts.analysed
    assert facts.query == "Say hi"
    assert facts.model == "gpt-3.5-turbo-instruct"
    assert facts.stream
