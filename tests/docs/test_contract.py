"""The docs are a contract: what the README and the manual name exists, and what the sidecar
exports is documented.

Read from the Markdown sources (their code spans and blocks, where names are written as a
user types them): every metric family, every admin endpoint, every ``semhealth`` command and
flag. Each is proven against the real thing: families against the catalogue of what the agent
registers and against a real ``semhealth run`` scraped after scripted traffic, endpoints by
asking a running sidecar's admin port, commands and flags against their ``--help``. The other
way round, every family that sidecar exports must be on the built metrics page.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.analysis.agent import metric_families
from semhealth.agent.cli import build_parser
from semhealth.agent.demo.simulator import Script, ScriptRequest, SimulatedUpstream
from semhealth.embeddings.scorer_metrics import ScorerMetrics
from tests.agent.test_cli import _env, _wait_ready
from tests.docs.runbooks import REPO
from tests.servers import free_port

PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
# A family name; not one inside a recording rule's level:name:operations, a path or a glob.
_FAMILY = re.compile(
    r"(?<![\w.:/])((?:semhealth|semantic_health|gen_ai)_[a-z0-9_]*[a-z0-9])(?![\w*:/])"
)
_ENDPOINT = re.compile(r"^/[a-z]+$")
_COMMAND = re.compile(r"(?<![\w./-])semhealth((?:\s+[a-z][a-z-]*)+)((?:\s+\S+)*)")
# Paths the manual writes that are not the admin port's: the filesystem, another server's API.
NOT_ADMIN = {
    "/tmp": "the sidecar's only writable folder",
    "/proc": "where the benchmarks read RSS",
    "/embed": "text-embeddings-inference's API, a remote backend",
}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# Names the manual writes that are no family of ours, each for its reason.
NOT_FAMILIES = {
    "semhealth_relevance_demand": "the name prometheus-adapter gives the chart's scaling query",
}


@cache
def code_spans() -> tuple[tuple[Path, str], ...]:
    """(page, text) of every fenced block and inline code span of the README and the manual."""
    spans: list[tuple[Path, str]] = []
    for page in PAGES:
        text = page.read_text("utf-8")
        spans += [(page, block) for block in _FENCE.findall(text)]
        spans += [(page, span) for span in _INLINE.findall(_FENCE.sub("", text))]
    return tuple(spans)


@cache
def agent_families() -> dict[str, str]:
    """Prometheus name -> kind of every family the sidecar can export."""
    return {family.prometheus_name: family.kind for family in metric_families()}


@cache
def scorer_families() -> set[str]:
    metrics = ScorerMetrics()
    metrics.read_stats(lambda: [], dict)
    names = {f.name + ("_total" if f.type == "counter" else "") for f in metrics.registry.collect()}
    # Families that appear only with a served encoder (collected with none above).
    return names | {
        f"semhealth_scorer_{name}"
        for name in (
            "requests_total",
            "texts_total",
            "overloaded_texts_total",
            "failed_requests_total",
            "rejected_requests_total",
            "expired_texts_total",
            "refused_requests_total",
            "queue_texts",
            "queue_capacity_texts",
            "throughput_texts_per_second",
            "encoder_up",
        )
    }


@cache
def label_names() -> set[str]:
    return {label.replace(".", "_") for f in metric_families() for label in f.labels}


def documented_families() -> dict[str, set[str]]:
    """Family name -> the pages that name it (a histogram's series count as the family)."""
    known = set(agent_families()) | scorer_families()
    found: dict[str, set[str]] = {}
    for page, span in code_spans():
        for name in _FAMILY.findall(span):
            if name in label_names() or name in NOT_FAMILIES:
                continue  # gen_ai_response_model and the like: labels, not families
            for suffix in HISTOGRAM_SERIES:
                if name.endswith(suffix) and name.removesuffix(suffix) in known:
                    name = name.removesuffix(suffix)
            found.setdefault(name, set()).add(str(page.relative_to(REPO)))
    return found


def documented_endpoints() -> set[str]:
    return {span for _, span in code_spans() if _ENDPOINT.match(span) and span not in NOT_ADMIN}


def documented_invocations() -> Iterator[tuple[str, list[str], list[str]]]:
    """(page, command words, flags) of every ``semhealth ...`` written as code."""
    for page, span in code_spans():
        for line in span.splitlines():
            line = line.split("#", 1)[0]  # a shell comment
            for match in _COMMAND.finditer(line):
                words = match.group(1).split()
                rest = match.group(2).split("|", 1)[0].split("&&", 1)[0]
                flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)
                yield str(page.relative_to(REPO)), words, flags


def _subparsers(parser: object) -> dict[str, object]:
    for action in getattr(parser, "_actions", ()):
        if getattr(action, "choices", None) and isinstance(action.choices, dict):
            return dict(action.choices)
    return {}


# -- metric families ---------------------------------------------------------------------------


def test_every_metric_family_the_docs_name_is_one_the_code_registers() -> None:
    known = set(agent_families()) | scorer_families() | {"target_info"}
    unknown = {name: pages for name, pages in documented_families().items() if name not in known}
    assert unknown == {}


def test_every_family_the_agent_registers_is_on_the_built_metrics_page(site: Path) -> None:
    page = (site / "reference" / "metrics" / "index.html").read_text("utf-8")
    missing = sorted(name for name in agent_families() if name not in page)
    assert missing == []


# -- the running sidecar -------------------------------------------------------------------------


@dataclass
class Scraped:
    exported: set[str]  # family names as Prometheus shows them
    admin: str
    statuses: dict[str, int]  # documented endpoint -> its status


def _script(request: ScriptRequest) -> Script:
    body = request.json if isinstance(request.json, dict) else {}
    if body.get("response_format"):  # structured output cut short: invalid JSON
        return Script(pieces=('{"a": ', "1"), ttft_s=0.02, gaps_s=0.01)
    # A stall (a gap past the 0.5 s threshold) in every plain stream.
    # One of its output tokens spent reasoning: the reasoning-token family has a value.
    return Script(
        pieces=("Paris ", "is ", "the ", "capital."),
        ttft_s=0.02,
        gaps_s=(0.01, 0.6, 0.01),
        reasoning_tokens=1,
    )


def _candidate(request: ScriptRequest) -> Script:
    # Another answer, so the shadow pairs differ (their divergence is measured).
    return Script(pieces=("Lyon ", "is ", "not ", "it."), ttft_s=0.02, gaps_s=0.01)


def _config(path: Path, candidate: str, otlp_port: int) -> None:
    path.write_text(
        f"""
otlp_receiver:
  http_listen: 127.0.0.1:{otlp_port}
  evaluation:
    enabled: true
    endpoint: http://127.0.0.1:{otlp_port}
shadow:
  upstream:
    url: {candidate}
  routes: [chat_completions]
  sample_rate: 1.0
  max_per_minute: 1000
alerts:
  alertmanager:
    urls: [http://127.0.0.1:{free_port()}]
""",
        "utf-8",
    )


async def _traffic(proxy: str, otlp: str) -> None:
    """Streams of every kind the families count, and the inputs the rejection counters
    count: a request with no query, a path no route shadows, a malformed request, a
    malformed OTLP export."""
    context = {"role": "system", "content": "Paris is the capital of France."}
    query = {"role": "user", "content": "What is the capital of France?"}
    async with aiohttp.ClientSession() as client:
        for structured, messages in ((False, [context, query]), (True, [context, query])) * 2 + (
            (False, [context]),
        ):
            body: dict[str, object] = {
                "model": "m",
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": messages,
            }
            if structured:
                body["response_format"] = {"type": "json_object"}
            async with client.post(proxy + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
                await response.read()
        async with client.get(proxy + "/v1/models") as response:
            await response.read()
        headers = {"Content-Type": "application/x-protobuf"}
        async with client.post(otlp + "/v1/traces", data=b"\xff" * 8, headers=headers) as r:
            assert r.status == 400
    host, port = proxy.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    assert (await reader.read(12)).startswith(b"HTTP/1.1 400")
    writer.close()


@asynccontextmanager
async def _sidecar(tmp: Path) -> AsyncIterator[tuple[str, str, str]]:
    upstream, candidate = SimulatedUpstream(_script), SimulatedUpstream(_candidate)
    await upstream.start()
    await candidate.start()
    config, record = tmp / "semhealth.yaml", tmp / "record.jsonl"
    otlp_port = free_port()
    _config(config, candidate.url, otlp_port)
    proxy_port, admin_port = free_port(), free_port()
    env = _env()
    env["SEMHEALTH_RELEVANCE__ENABLED"] = "true"  # the relevance families need scores
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--config", str(config),
        "--upstream", upstream.url,
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        "--record", str(record),
        env=env,
    )  # fmt: skip
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        await _wait_ready(admin, deadline_s=90)
        yield f"http://127.0.0.1:{proxy_port}", admin, f"http://127.0.0.1:{otlp_port}"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 30)
        await upstream.shutdown()
        await candidate.shutdown()


def _exported(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


async def _scrape_until(admin: str, wanted: set[str], timeout_s: float = 30.0) -> set[str]:
    """The families on ``/metrics`` once ``wanted`` are all there (records and scores are
    asynchronous), or at the timeout."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    async with aiohttp.ClientSession() as client:
        while True:
            async with client.get(admin + "/metrics") as response:
                assert response.status == 200
                exported = _exported(await response.text())
            if wanted <= exported or loop.time() > end:
                return exported
            await asyncio.sleep(0.25)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Scraped:
    async def run() -> Scraped:
        async with _sidecar(tmp_path_factory.mktemp("contract")) as (proxy, admin, otlp):
            await _traffic(proxy, otlp)
            exported = await _scrape_until(admin, set(agent_families()) - set(OPTIONAL_HERE))
            statuses = {}
            async with aiohttp.ClientSession() as client:
                for endpoint in sorted(documented_endpoints()):
                    async with client.get(admin + endpoint) as response:
                        statuses[endpoint] = response.status
            return Scraped(exported, admin, statuses)

    return asyncio.run(run())


# What this run cannot make appear, each for its reason; everything else must be exported.
OPTIONAL_HERE = {
    "semhealth_otlp_forward_total": "no otlp_receiver.forward endpoint in this run",
    "semhealth_otlp_forward_queue_bytes": "no otlp_receiver.forward endpoint in this run",
    "semhealth_background_failures_total": "by task, and no background task dies here",
    "semhealth_otlp_genai_malformed_total": "by reason, and no GenAI attribute is malformed here",
    "semhealth_otlp_shed_total": "by reason, and nothing overloads the OTLP analysis queue here",
    "semhealth_requests_unanalysed_total": "by reason, and no request is over the tap budget here",
    "semhealth_shadow_shed_total": "by reason, and no shadowed request is over budget here",
    "semantic_health_provider_tool_calls_total": "by tool kind, and no provider runs a tool here",
}


def test_every_family_the_running_sidecar_exports_is_documented(
    scraped: Scraped, site: Path
) -> None:
    page = (site / "reference" / "metrics" / "index.html").read_text("utf-8")
    undocumented = sorted(
        name for name in scraped.exported if name != "target_info" and name not in page
    )
    assert undocumented == []
    assert scraped.exported - {"target_info"} <= set(agent_families())


def test_every_family_the_docs_promise_is_exported_after_scripted_traffic(
    scraped: Scraped,
) -> None:
    promised = {name for name in documented_families() if name in agent_families()}
    missing = sorted(promised - scraped.exported - set(OPTIONAL_HERE))
    assert missing == []


# -- admin endpoints -----------------------------------------------------------------------------


def test_the_docs_name_the_admin_endpoints() -> None:
    assert {"/metrics", "/alerts", "/healthz", "/readyz", "/shadow"} <= documented_endpoints()


def test_every_admin_endpoint_the_docs_name_answers_on_the_admin_port(scraped: Scraped) -> None:
    assert scraped.statuses == dict.fromkeys(sorted(documented_endpoints()), 200)


# -- the command line ----------------------------------------------------------------------------


def test_every_command_and_flag_the_docs_write_is_in_its_help() -> None:
    parser = build_parser()
    wrong = []
    for page, words, flags in documented_invocations():
        command = parser
        path = []
        for word in words:
            nested = _subparsers(command)
            if not nested:
                break  # the rest are arguments: FILE, a URL, ...
            if word not in nested:
                wrong.append(f"{page}: semhealth {' '.join([*path, word])}: no such command")
                break
            command, path = nested[word], [*path, word]
        help_text = command.format_help()  # type: ignore[attr-defined]
        for flag in flags:
            if flag not in help_text:
                wrong.append(f"{page}: semhealth {' '.join(path)} {flag}: not in its --help")
    assert wrong == []


def test_every_command_and_flag_is_on_the_built_cli_page(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text("utf-8")
    missing = []
    stack = [("semhealth", build_parser())]
    while stack:
        name, parser = stack.pop()
        if name not in page:
            missing.append(name)
        for action in parser._actions:
            missing += [f"{name} {flag}" for flag in action.option_strings if flag not in page]
        stack += [(f"{name} {sub}", nested) for sub, nested in _subparsers(parser).items()]
    assert missing == []
