"""A scripted upstream LLM: a real aiohttp server on loopback that streams with set timings.

This is the one fake semhealth needs. Tests script exact responses and timings to check what
the proxy measures; ``semhealth demo`` plugs in ``demo_script`` for randomised, realistic
traffic. Per path suffix it speaks the real wire formats (what the ``openai`` and ``anthropic``
SDKs parse):

    */chat/completions   OpenAI chat completions   SSE ``data:`` chunks, ``[DONE]``
    */responses          OpenAI Responses API      SSE ``event:`` + ``data:``, ``sequence_number``
    */messages           Anthropic messages        SSE ``event:`` + ``data:``, ``ping``
    */api/chat           Ollama chat               NDJSON, streams unless ``"stream": false``
    */api/generate       Ollama generate           NDJSON, streams unless ``"stream": false``
    */generate_stream    TGI                       SSE token events, always streams
    */generate           TGI                       one JSON body
    *:streamGenerateContent  Gemini, Vertex AI     SSE with ``alt=sse``, else a JSON array
    *:generateContent    Gemini, Vertex AI         one JSON body
    */converse-stream    Bedrock ConverseStream    AWS event-stream frames
    */converse           Bedrock Converse          one JSON body
    */invoke-with-response-stream   Bedrock        Claude's events, base64 in ``chunk`` frames
    */v2/chat            Cohere v2 chat            SSE ``event:`` + ``data:``, if ``stream``

Timing model of one streamed answer: the response head goes out at once (t0); the stream's
opening frames (role chunk, ``response.created``, ``message_start``, ...) follow immediately;
content delta *i* is written at ``t0 + ttft_s + sum(gaps[:i])`` on the event loop's clock, each
in its own ``write`` (one HTTP chunk, one TCP send with TCP_NODELAY) so a proxy in between sees
it arrive on its own; closing frames follow the last delta. Sleeping to absolute times rather
than for relative durations keeps scheduling error from accumulating over a long stream.
A non-streamed answer is sent whole at the time the last delta would have been.

The tool arguments of a script are deltas too, after the text. Wires without streamed tool
arguments degrade as the real servers do: Ollama chat sends the whole tool call in one line
(at the last argument's time, counted as one delta); Ollama generate and TGI stream the
argument pieces as text.
"""

from semhealth.agent.demo.simulator._corpus import CORPUS, CorpusEntry, best_entry, query_text
from semhealth.agent.demo.simulator._demo import DemoProfile, demo_script
from semhealth.agent.demo.simulator._script import (
    FINISH_REASONS,
    RawScript,
    Script,
    ScriptFor,
    ScriptRequest,
    ToolScript,
)
from semhealth.agent.demo.simulator._server import SimulatedUpstream

__all__ = [
    "CORPUS",
    "FINISH_REASONS",
    "CorpusEntry",
    "DemoProfile",
    "RawScript",
    "Script",
    "ScriptFor",
    "ScriptRequest",
    "SimulatedUpstream",
    "ToolScript",
    "best_entry",
    "demo_script",
    "query_text",
]
