"""A response an admin server makes itself. Plain data, light to import: the forwarding
process builds these for its front, the gate for its refusals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Answer:
    """A response an admin server makes itself: health, analysis being away, a refusal."""

    status: int
    body: bytes
    content_type: str = "text/plain"
    error: str | None = None  # X-Semhealth-Error
    headers: tuple[tuple[str, str], ...] = ()  # more, such as a 401's WWW-Authenticate
