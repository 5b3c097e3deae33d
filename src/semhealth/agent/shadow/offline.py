"""``semhealth diff``: the shadow comparison offline, on recorded traffic.

Two ways in:

* ``--candidate URL FILE...``: every recorded request (the replay format: a ``--record``
  file or a HAR) is sent again to the candidate upstream, at most ``concurrency`` at a time,
  and the candidate's answer, timed as it arrives, is analysed by the same collectors into a
  record and paired with the recorded one;
* ``A B``: two recordings of the same requests. Requests are joined by what was sent
  (method, path and body): the n-th occurrence of a request in A pairs with its n-th in B.

Either way the pairs are compared as live shadowing compares them (``pairs.compare`` and
the scorer's agreement) and summarised per route with the verdict.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from semhealth.agent.config import Config
from semhealth.agent.config.contracts import attach_contracts
from semhealth.agent.relevance import EMPTY, LoadedEncoders, offline_scorer
from semhealth.agent.replay.format import RecordedExchange
from semhealth.agent.replay.inputs import ExchangeInput, read_file
from semhealth.agent.replay.pipeline import exchange_record
from semhealth.agent.replay.results import InputProblem
from semhealth.agent.shadow.diff import Segmenter
from semhealth.agent.shadow.pairs import PairResult, agreement, compare
from semhealth.collectors import Config as CollectorsConfig
from semhealth.collectors import Exchange, StreamCollector, StreamRecord
from semhealth.embeddings import EmbeddingError, Overloaded, Scorer

Progress = Callable[[int], object]


@dataclass(slots=True)
class Compared:
    pairs: list[PairResult] = field(default_factory=list)
    problems: list[InputProblem] = field(default_factory=list)
    unpaired: int = 0  # requests found in only one of two recordings
    relevance_off: str | None = None


def exchanges(paths: Sequence[str], problems: list[InputProblem]) -> list[ExchangeInput]:
    """The recorded exchanges of ``paths``; anything else (OTLP input, bad lines) is a
    problem: a span holds no request to send again."""
    found: list[ExchangeInput] = []
    for path in paths:
        for item in read_file(path):
            if isinstance(item, ExchangeInput):
                found.append(item)
            elif isinstance(item, InputProblem):
                problems.append(item)
            else:
                problems.append(
                    InputProblem(
                        source_file=item.source_file,
                        line=item.line,
                        error="OTLP input holds no request to compare; use a recording or HAR",
                    )
                )
    return found


def request_key(recorded: RecordedExchange) -> str:
    digest = hashlib.sha256()
    for part in (recorded.method.encode(), recorded.path.encode(), recorded.request_body or b""):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def join_recordings(
    primary: Sequence[ExchangeInput], shadow: Sequence[ExchangeInput]
) -> tuple[list[tuple[ExchangeInput, ExchangeInput]], int]:
    """Pairs of the same request, in the primary's order, and how many found no partner."""
    waiting: dict[str, list[ExchangeInput]] = {}
    for item in shadow:
        waiting.setdefault(request_key(item.recorded), []).append(item)
    pairs = []
    for item in primary:
        queue = waiting.get(request_key(item.recorded))
        if queue:
            pairs.append((item, queue.pop(0)))
    unpaired = (len(primary) - len(pairs)) + sum(len(queue) for queue in waiting.values())
    return pairs, unpaired


# --------------------------------------------------------------------------- the candidate


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    url: str  # base URL; each recorded path is joined to it
    headers: Mapping[str, str] = field(default_factory=dict)
    rewrite_model: str | None = None
    concurrency: int = 8
    timeout_s: float = 300.0


def rewrite_model(body: bytes | None, model: str | None) -> bytes | None:
    """``body`` with its JSON ``model`` replaced by ``model``; any other body as it was."""
    if model is None or body is None:
        return body
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if isinstance(document, dict) and "model" in document:
        document["model"] = model
        return orjson.dumps(document)
    return body


def candidate_body(recorded: RecordedExchange, rewrite: str | None) -> bytes | None:
    return rewrite_model(recorded.request_body, rewrite)


def candidate_url(base_url: str, path: str) -> str:
    """Where ``path`` (a request's path and query as the client sent them) goes on the
    candidate at ``base_url``.

    A base URL may end in the API prefix the paths already carry, as providers write their base
    URLs (``http://candidate:8000/v1`` for ``/v1/chat/completions``): that prefix is not
    repeated. Any other base path prefixes the request's, as the proxy's upstream URL does.
    """
    base = urlsplit(base_url)
    prefix = base.path.rstrip("/")
    request_path, _, query = path.partition("?")
    request_path = "/" + request_path.lstrip("/")
    if not (request_path == prefix or request_path.startswith(prefix + "/")):
        request_path = prefix + request_path
    return urlunsplit((base.scheme, base.netloc, request_path, query, ""))


Headers = Mapping[str, str] | Sequence[tuple[str, str]]


async def send_request(
    session: aiohttp.ClientSession,
    base_url: str,
    headers: Headers,
    method: str,
    path: str,
    body: bytes | None,
    collectors: CollectorsConfig,
) -> StreamRecord:
    """The answer of the upstream at ``base_url`` to one request, recorded as the proxy
    records one: timed as it arrives, analysed by the same StreamCollector, and a failure
    marked as the relay marks it (``_failed``). Offline ``diff`` and live shadowing both send
    through here. ``headers`` are sent as given, a JSON Content-Type added if none is."""
    sent = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    if not any(name.lower() == "content-type" for name, _ in sent):
        sent.append(("Content-Type", "application/json"))
    start = time.monotonic_ns()
    url = candidate_url(base_url, path)
    collector: StreamCollector | None = None
    try:
        async with session.request(method, url, data=body, headers=sent) as response:
            exchange = Exchange(
                method=method,
                path=path,
                start_ns=start,
                status=response.status,
                content_type=response.headers.get("Content-Type"),
                content_encoding=response.headers.get("Content-Encoding"),
                response_ns=time.monotonic_ns(),
                request_body=body,
            )
            collector = StreamCollector(exchange, collectors)
            async for chunk in response.content.iter_any():
                collector.feed(chunk, time.monotonic_ns())
            return collector.finish(time.monotonic_ns())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return _failed(collector, exc, start, method, path, body, collectors)


# The relay's own answers when no response head came (``dataplane.relay``'s ``_ERRORS``).
_NO_HEAD_STATUS = {"upstream_unreachable": 502, "upstream_timeout": 504}


def _failed(
    collector: StreamCollector | None,
    exc: Exception,
    start: int,
    method: str,
    path: str,
    body: bytes | None,
    collectors: CollectorsConfig,
) -> StreamRecord:
    """The record of a request that failed, as the relay's outcome would make it. Mid-body
    (a collector was fed): the upstream's status, the answer as far as it came, and the cut
    (``upstream_aborted``, ``error_type`` upstream_aborted or upstream_timeout). Before the
    response head: the relay's own 502 or 504, nothing analysed."""
    end = time.monotonic_ns()
    timed_out = isinstance(exc, TimeoutError)
    if collector is not None:
        kind = "upstream_timeout" if timed_out else "upstream_aborted"
        return collector.finish(end, upstream_aborted=True, error_type=kind)
    kind = "upstream_timeout" if timed_out else "upstream_unreachable"
    failed = Exchange(
        method=method,
        path=path,
        start_ns=start,
        status=_NO_HEAD_STATUS[kind],
        content_type=None,
        content_encoding=None,
        response_ns=None,
        request_body=body,
    )
    return StreamCollector(failed, collectors).finish(end, error_type=kind)


async def ask_candidate(
    session: aiohttp.ClientSession,
    candidate: Candidate,
    recorded: RecordedExchange,
    collectors: CollectorsConfig,
) -> StreamRecord:
    """The candidate's answer to ``recorded``'s request, analysed as the tap analyses one."""
    body = candidate_body(recorded, candidate.rewrite_model)
    return await send_request(
        session, candidate.url, candidate.headers, recorded.method, recorded.path, body, collectors
    )


# --------------------------------------------------------------------------- the comparison


async def _with_agreement(
    pair: PairResult, primary: StreamRecord, shadow: StreamRecord, scorer: Scorer | str
) -> PairResult:
    if isinstance(scorer, str):
        return pair
    for attempt in range(20):
        try:
            return await agreement(pair, primary, shadow, scorer)
        except Overloaded:
            await asyncio.sleep(0.05 * (attempt + 1))  # offline: waiting is fine
        except EmbeddingError:
            return pair
    return pair


async def diff_recordings(
    primary_path: str,
    shadow_path: str,
    config: Config,
    segment: Segmenter,
    *,
    loaded: LoadedEncoders = EMPTY,
    progress: Progress = lambda _n: None,
) -> Compared:
    compared = Compared()
    collectors = attach_contracts(config.collectors)
    ours = exchanges([primary_path], compared.problems)
    theirs = exchanges([shadow_path], compared.problems)
    joined, compared.unpaired = join_recordings(ours, theirs)
    async with offline_scorer(config.relevance, loaded) as scorer:
        compared.relevance_off = scorer if isinstance(scorer, str) else None
        for first, second in joined:
            a, b = exchange_record(first, collectors), exchange_record(second, collectors)
            pair = compare(first.recorded.id, a, b, segment)
            compared.pairs.append(await _with_agreement(pair, a, b, scorer))
            progress(1)
    return compared


async def diff_candidate(
    paths: Sequence[str],
    candidate: Candidate,
    config: Config,
    segment: Segmenter,
    *,
    loaded: LoadedEncoders = EMPTY,
    progress: Progress = lambda _n: None,
) -> Compared:
    compared = Compared()
    collectors = attach_contracts(config.collectors)
    recorded = exchanges(paths, compared.problems)
    gate = asyncio.Semaphore(candidate.concurrency)
    timeout = aiohttp.ClientTimeout(total=candidate.timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session,
        offline_scorer(config.relevance, loaded) as scorer,
    ):
        compared.relevance_off = scorer if isinstance(scorer, str) else None

        async def one(item: ExchangeInput) -> PairResult:
            async with gate:
                theirs = await ask_candidate(session, candidate, item.recorded, collectors)
            ours = exchange_record(item, collectors)
            pair = compare(item.recorded.id, ours, theirs, segment)
            result = await _with_agreement(pair, ours, theirs, scorer)
            progress(1)
            return result

        compared.pairs = list(await asyncio.gather(*(one(item) for item in recorded)))
    return compared


def count(pairs: Iterable[PairResult], result: str) -> int:
    return sum(pair.result == result for pair in pairs)
