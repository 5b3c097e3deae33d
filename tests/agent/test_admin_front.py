"""The admin front of ``semhealth run`` as an HTTP server: health answered itself, the rest
relayed from the analysis process's admin server (here a real aiohttp app on a Unix socket),
and what a client can get wrong answered plainly without harming the next request.

The web configuration's part (TLS, basic auth, headers, rate limit) is proven on a real
``semhealth run`` in ``test_admin_lockdown.py``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from semhealth.agent.admin import front as front_module
from semhealth.agent.admin.answer import Answer
from semhealth.agent.admin.front import Front
from semhealth.agent.admin.gate import AdminAccess, AdminGate

ANALYSIS_METRICS = b"# TYPE semhealth_records_total counter\nsemhealth_records_total 7.0\n"
RESTARTING = Answer(503, b'{"error": "restarting"}', "application/json", "analysis_restarting")


@dataclass
class Served:
    url: str
    host: str
    port: int
    seen: list[str] = field(default_factory=list)  # the targets analysis was asked for
    away: list[bool] = field(default_factory=lambda: [False])


async def _analysis_app(seen: list[str]) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.Response(body=ANALYSIS_METRICS, content_type="text/plain", charset="utf-8")

    async def alerts(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.Response(status=404, body=b'{"enabled": false}', content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/alerts", alerts)
    return app


@asynccontextmanager
async def front(
    tmp_path: Path, *, analysis: bool = True, alerts_endpoint: bool = True
) -> AsyncIterator[Served]:
    socket_path = str(tmp_path / "admin.sock")
    seen: list[str] = []
    runner = web.AppRunner(await _analysis_app(seen), access_log=None)
    await runner.setup()
    if analysis:
        await web.UnixSite(runner, socket_path).start()
    away = [False]

    def analysis_down() -> Answer | None:
        return RESTARTING if away[0] else None

    served = Front(
        health=lambda: Answer(200, b"ok\n"),
        readiness=lambda: Answer(200, b'{"forwarding": "ready"}\n', "application/json"),
        analysis_down=analysis_down,
        analysis_socket=socket_path,
        gate=AdminGate(AdminAccess(alerts_endpoint=alerts_endpoint)),
    )
    host, port = await served.start("127.0.0.1", 0)
    try:
        yield Served(f"http://{host}:{port}", host, port, seen, away)
    finally:
        await served.close()
        await runner.cleanup()


async def _get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as client, client.request(method, url) as response:
        return response.status, dict(response.headers), await response.read()


async def _raw(served: Served, data: bytes, *, read_s: float = 5.0) -> bytes:
    """Send ``data`` as it is and read what comes back until the front closes."""
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), read_s)
    finally:
        writer.close()


def _statuses(data: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


async def test_health_and_readiness_are_answered_by_the_front_itself(tmp_path: Path) -> None:
    async with front(tmp_path, analysis=False) as served:
        status, headers, body = await _get(served.url + "/healthz")
        assert (status, body) == (200, b"ok\n")
        assert headers["Cache-Control"] == "no-store"
        status, headers, body = await _get(served.url + "/readyz")
        assert (status, headers["Content-Type"]) == (200, "application/json")
        assert served.seen == []


async def test_metrics_come_from_analysis_with_the_fronts_auth_failures_added(
    tmp_path: Path,
) -> None:
    async with front(tmp_path) as served:
        status, headers, body = await _get(served.url + "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; charset=utf-8"  # as analysis gave it
    assert body.startswith(ANALYSIS_METRICS)
    assert body.endswith(b"semhealth_admin_auth_failures_total 0.0\n")
    assert int(headers["Content-Length"]) == len(body)


async def test_the_query_string_reaches_analysis_as_sent(tmp_path: Path) -> None:
    async with front(tmp_path) as served:
        await _get(served.url + "/metrics?name=semhealth_records_total&debug=1")
    assert served.seen == ["/metrics?name=semhealth_records_total&debug=1"]


async def test_a_status_of_analysis_is_relayed_as_it_is(tmp_path: Path) -> None:
    async with front(tmp_path) as served:
        status, headers, body = await _get(served.url + "/alerts")
    assert (status, body) == (404, b'{"enabled": false}')
    assert headers["Content-Type"] == "application/json"


async def test_alerts_turned_off_are_answered_without_asking_analysis(tmp_path: Path) -> None:
    async with front(tmp_path, alerts_endpoint=False) as served:
        status, _, body = await _get(served.url + "/alerts")
        assert status == 404 and b"turned off" in body
        assert served.seen == []


async def test_while_analysis_restarts_its_paths_answer_503_and_health_stays_200(
    tmp_path: Path,
) -> None:
    async with front(tmp_path) as served:
        served.away[0] = True
        status, headers, _ = await _get(served.url + "/metrics")
        assert (status, headers["X-Semhealth-Error"]) == (503, "analysis_restarting")
        assert (await _get(served.url + "/healthz"))[0] == 200
        assert served.seen == []


async def test_analysis_that_does_not_answer_is_503_not_an_error_of_the_front(
    tmp_path: Path,
) -> None:
    async with front(tmp_path, analysis=False) as served:  # nothing on the socket
        status, headers, body = await _get(served.url + "/shadow")
    assert (status, headers["X-Semhealth-Error"]) == (503, "analysis_restarting")
    assert b"forwarding goes on" in body


async def test_one_connection_serves_requests_one_after_another(tmp_path: Path) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n"
    last = b"GET /readyz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    async with front(tmp_path) as served:
        data = await _raw(served, request + request + last)
    assert _statuses(data) == [200, 200, 200]
    assert data.count(b"ok\n") == 2 and data.endswith(b'{"forwarding": "ready"}\n')


async def test_head_answers_the_headers_of_get_without_the_body(tmp_path: Path) -> None:
    async with front(tmp_path) as served:
        _, _, body = await _get(served.url + "/healthz")
        data = await _raw(
            served, b"HEAD /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
        )
    head, _, rest = data.partition(b"\r\n\r\n")
    assert _statuses(head) == [200] and rest == b""
    assert f"content-length: {len(body)}".encode() in head.lower()


@pytest.mark.parametrize(
    ("request_line", "status", "allow"),
    [
        (b"GET /nothing HTTP/1.1", 404, None),
        (b"POST /metrics HTTP/1.1", 405, b"GET, HEAD"),
        (b"DELETE /healthz HTTP/1.1", 405, b"GET, HEAD"),
    ],
)
async def test_unknown_paths_and_methods_are_refused_by_name(
    tmp_path: Path, request_line: bytes, status: int, allow: bytes | None
) -> None:
    async with front(tmp_path) as served:
        data = await _raw(
            served,
            request_line + b"\r\nHost: admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        assert _statuses(data) == [status]
        assert (b"\r\nAllow: " + allow in data) if allow else b"Allow:" not in data
        assert served.seen == []


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"this is not http\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nX: " + b"y" * (20 * 1024) + b"\r\n\r\n", 431),
        (
            b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 70000\r\n\r\n" + b"z" * 70000,
            413,
        ),
    ],
    ids=["garbage", "no-host", "head-over-16-KiB", "body-over-16-KiB"],
)
async def test_what_does_not_parse_or_is_too_large_is_answered_and_closed(
    tmp_path: Path, data: bytes, status: int
) -> None:
    async with front(tmp_path) as served:
        answer = await _raw(served, data)
        assert _statuses(answer) == [status]
        assert b"connection: close" in answer.lower()
        # The front goes on serving.
        assert (await _get(served.url + "/healthz"))[0] == 200


async def test_a_request_left_unfinished_is_answered_408_after_the_request_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(front_module, "REQUEST_S", 0.3)
    async with front(tmp_path) as served:
        loop = asyncio.get_running_loop()
        began = loop.time()
        answer = await _raw(served, b"GET /healthz HTTP/1.1\r\nHost: a\r\n")  # no blank line
        assert _statuses(answer) == [408]
        assert 0.25 <= loop.time() - began < 3.0


async def test_an_idle_connection_is_closed_after_the_keepalive_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(front_module, "KEEPALIVE_S", 0.3)
    async with front(tmp_path) as served:
        answer = await _raw(served, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    assert _statuses(answer) == [200]  # then closed: _raw read to the end


async def test_close_ends_the_connections_still_open(tmp_path: Path) -> None:
    async with front(tmp_path) as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        await writer.drain()
        assert _statuses(await reader.readuntil(b"ok\n")) == [200]
        pending: Callable[[], object] = reader.read
    assert await asyncio.wait_for(pending(), 5) == b""  # closed by the front's close
    writer.close()
