"""The manual as its readers get it: ``mkdocs build --strict`` builds the site, a real HTTP
server on loopback serves it, and Debian's headless Chromium opens the home page and follows
every link of the navigation. Each page must answer 200 and have an ``<h1>``, and every link
on it that stays on the site must reach a page (and, with a ``#fragment``, an element of that
id). The default rules' runbook links must land on built pages.

Chromium is driven over its DevTools protocol, so one browser visits every page. Skipped
without Chromium, failed instead under ``REQUIRE_REAL_SERVERS=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

import aiohttp

from semhealth.alerts import load_rules
from tests.docs.runbooks import SITE_URL
from tests.servers import require_binary

# What one page shows: its headings, the navigation's links, every link, every element id.
_READ_PAGE = """(() => ({
  h1: Array.from(document.querySelectorAll("article h1, .md-content h1"), e => e.textContent.trim()),
  nav: Array.from(document.querySelectorAll("nav.md-nav--primary a.md-nav__link[href]"), a => a.href),
  links: Array.from(document.querySelectorAll("a[href]"), a => a.href),
  ids: Array.from(document.querySelectorAll("[id]"), e => e.id),
}))()"""
_CHROMIUM_FLAGS = (
    "--headless",
    "--disable-gpu",
    "--no-sandbox",  # CI runs as root
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # nothing off the site
)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(root: Path) -> Iterator[str]:
    """``root`` over HTTP on a loopback port; yields the base URL (ending in ``/``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@dataclass
class Page:
    url: str
    status: int
    h1: list[str]
    nav: list[str]
    links: list[str]
    ids: set[str]


class Browser:
    """One headless Chromium tab, driven over the DevTools protocol."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._next = 0
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._socket:
            data = json.loads(message.data)
            if "id" in data:
                self._waiting.pop(data["id"]).set_result(data)
            else:
                self._events.put_nowait(data)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        answer = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = answer
        await self._socket.send_str(
            json.dumps({"id": self._next, "method": method, "params": params})
        )
        data = await asyncio.wait_for(answer, 30)
        assert "error" not in data, (method, data["error"])
        return dict(data["result"])

    async def open(self, url: str) -> Page:
        while not self._events.empty():
            self._events.get_nowait()
        loader = (await self.call("Page.navigate", url=url))["loaderId"]
        status = 0
        while True:
            event = await asyncio.wait_for(self._events.get(), 30)
            params = event.get("params", {})
            if (
                event["method"] == "Network.responseReceived"
                and params.get("loaderId") == loader
                and params.get("type") == "Document"
            ):
                status = int(params["response"]["status"])
            if event["method"] == "Page.loadEventFired":
                break
        shown = await self.call("Runtime.evaluate", expression=_READ_PAGE, returnByValue=True)
        value = shown["result"]["value"]
        return Page(url, status, value["h1"], value["nav"], value["links"], set(value["ids"]))


@contextlib.asynccontextmanager
async def chromium_tab(binary: str, profile: Path) -> AsyncIterator[Browser]:
    process = await asyncio.create_subprocess_exec(
        binary,
        *_CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        endpoint = ""
        while not endpoint:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "Chromium exited before it offered a DevTools endpoint"
            if line.startswith("DevTools listening on "):
                endpoint = line.split()[-1]
        port = urlsplit(endpoint).port
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as answer:
                targets = await answer.json()
            tab = next(target for target in targets if target["type"] == "page")
            async with session.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                browser = Browser(socket)
                await browser.call("Page.enable")
                await browser.call("Network.enable")
                yield browser
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def built_pages(site: Path, base: str) -> set[str]:
    """The URL of every page the build wrote (``<page>/index.html``)."""
    return {
        urljoin(base, str(path.parent.relative_to(site)) + "/").replace("/./", "/")
        for path in site.rglob("index.html")
        if path.parent.name not in {"search", "assets"}
    }


def _on_site(url: str, base: str) -> bool:
    return url.startswith(base)


async def test_the_navigation_reaches_every_page_and_no_link_is_broken(
    site: Path, tmp_path: Path
) -> None:
    binary = require_binary("chromium", "chromium")
    with serving(site) as base:
        async with chromium_tab(binary, tmp_path / "profile") as browser:
            pages: dict[str, Page] = {}
            queue = [base]
            while queue:
                url = queue.pop(0)
                if url in pages:
                    continue
                page = pages[url] = await browser.open(url)
                queue += [
                    link
                    for link in (urldefrag(nav)[0] for nav in page.nav)
                    if _on_site(link, base) and link not in pages
                ]
        problems = []
        for page in pages.values():
            if page.status != 200:
                problems.append(f"{page.url}: HTTP {page.status}")
            if len(page.h1) != 1:
                problems.append(f"{page.url}: {len(page.h1)} <h1> ({page.h1})")
        statuses: dict[str, int] = {}
        for page in pages.values():
            for link in page.links:
                if not _on_site(link, base):
                    continue
                target, fragment = urldefrag(link)
                if target not in statuses:
                    statuses[target] = (
                        pages[target].status if target in pages else status_of(target)
                    )
                if statuses[target] != 200:
                    problems.append(f"{page.url}: link {link} answers {statuses[target]}")
                elif fragment and target in pages and fragment not in pages[target].ids:
                    problems.append(f"{page.url}: link {link}: no element with id {fragment!r}")
        assert not problems, "\n".join(problems)
        # The navigation holds every page of the manual: each built page was reached.
        assert built_pages(site, base) - set(pages) == set(), "pages the navigation never reaches"
        assert len(pages) >= 30


def test_every_runbook_url_of_the_default_rules_is_a_built_page(site: Path) -> None:
    rules = load_rules()
    assert rules
    with serving(site) as base:
        for rule in rules:
            url = rule.annotations["runbook_url"]
            assert url.startswith(SITE_URL), url
            path = url.removeprefix(SITE_URL)
            assert (site / path / "index.html").is_file(), f"{rule.name}: {path} was not built"
            assert status_of(base + path) == 200, rule.name
