"""What semhealth knows of one provider's wire format, in one record.

Each provider module declares its ``Provider`` entries beside the code they name (its
response adapter, its request reader, its paths); ``registry`` gathers them into the one table
the proxy, replay, shadow diffing and the OTLP tap's GenAI mapping all read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from semhealth.collectors.adapters.base import Adapter
from semhealth.collectors.adapters.conversation import RequestReader


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    """One wire format: a value of a route's ``provider:`` and of a record's ``provider``.

    ``suffixes`` are the request paths (query excluded) that imply it. A platform that serves
    another provider's format at the same suffixes (Azure OpenAI, Vertex AI's Gemini) also
    names a ``platform`` pattern, searched in the path with its query; it is tried before
    the plain suffixes, so the platform wins where both match.
    """

    name: str
    adapter: Callable[[], Adapter]
    read_request: RequestReader
    gen_ai_name: str  # gen_ai.provider.name, the GenAI conventions' well-known value
    operation: str = "chat"  # gen_ai.operation.name
    suffixes: tuple[str, ...] = ()
    platform: re.Pattern[str] | None = None
