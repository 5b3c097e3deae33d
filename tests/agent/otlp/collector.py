"""A next-hop OTLP collector for tests: gRPC and HTTP/protobuf, all three signals, on loopback.

It keeps every export request's bytes exactly as they arrived (gRPC without a deserializer,
HTTP after undoing its Content-Encoding), so a test can say that what semhealth forwarded is
byte for byte what the application sent. It can refuse exports (``fail_grpc`` /
``fail_http``, with ``retry_after_s``), and ``stop``/``start`` again on the same ports stands
for a collector that goes down and comes back.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped]
from aiohttp import web
from google.protobuf.duration_pb2 import Duration  # type: ignore[import-untyped]
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.servers import free_port

SERVICES = {
    "traces": ("opentelemetry.proto.collector.trace.v1.TraceService", ExportTraceServiceResponse),
    "logs": ("opentelemetry.proto.collector.logs.v1.LogsService", ExportLogsServiceResponse),
    "metrics": (
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        ExportMetricsServiceResponse,
    ),
}


@dataclass(frozen=True, slots=True)
class Export:
    signal: str
    transport: str  # grpc | http
    body: bytes
    headers: dict[str, str]


class Collector:
    """Both transports at once; ``grpc_endpoint`` and ``http_endpoint`` are what
    ``otlp_receiver.forward.endpoint`` takes for each protocol."""

    def __init__(self) -> None:
        self.exports: list[Export] = []
        self.attempts = 0
        self.fail_grpc: Any = None  # a grpc.StatusCode refusing every export
        self.fail_http: int | None = None  # an HTTP status refusing every export
        self.retry_after_s: int | None = None  # sent with the refusal (Retry-After / RetryInfo)
        self.grpc_port = free_port()
        self.http_port = free_port()
        self._grpc: Any = None
        self._http: web.AppRunner | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def bodies(self, signal: str) -> list[bytes]:
        return [export.body for export in self.exports if export.signal == signal]

    async def wait_exports(self, n: int, timeout_s: float = 10.0) -> list[Export]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.exports) < n:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {n} exports at the collector, got {len(self)}")
            await asyncio.sleep(0.01)
        return list(self.exports)

    def __len__(self) -> int:
        return len(self.exports)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        for signal, (service, response) in SERVICES.items():
            handler = grpc.unary_unary_rpc_method_handler(self._grpc_export(signal, response))
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {"Export": handler}),)
            )
        server.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        await server.start()
        self._grpc = server
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for signal, (_, response) in SERVICES.items():
            app.router.add_post(f"/v1/{signal}", self._http_export(signal, response))
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.http_port, reuse_address=True).start()
        self._http = runner

    async def stop(self) -> None:
        server, self._grpc = self._grpc, None
        if server is not None:
            await server.stop(grace=None)
        runner, self._http = self._http, None
        if runner is not None:
            await runner.cleanup()

    # -- handlers ---------------------------------------------------------------------------

    def _grpc_export(self, signal: str, response: Any) -> Any:
        async def export(body: bytes, context: Any) -> bytes:
            self.attempts += 1
            if self.fail_grpc is not None:
                if self.retry_after_s is not None:
                    context.set_trailing_metadata(
                        (("grpc-status-details-bin", _retry_info(self.retry_after_s)),)
                    )
                await context.abort(self.fail_grpc, "test collector refuses exports")
            metadata = {str(k).lower(): str(v) for k, v in context.invocation_metadata() or ()}
            self.exports.append(Export(signal, "grpc", body, metadata))
            return bytes(response().SerializeToString())

        return export

    def _http_export(self, signal: str, response: Any) -> Any:
        async def export(request: web.Request) -> web.Response:
            self.attempts += 1
            if self.fail_http is not None:
                headers = {}
                if self.retry_after_s is not None:
                    headers["Retry-After"] = str(self.retry_after_s)
                return web.Response(status=self.fail_http, text="refused", headers=headers)
            if request.content_type != "application/x-protobuf":
                return web.Response(status=415, text="expected application/x-protobuf")
            body = await request.read()
            if request.headers.get("Content-Encoding", "") == "gzip":
                body = gzip.decompress(body)
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.exports.append(Export(signal, "http", body, headers))
            return web.Response(
                body=response().SerializeToString(), content_type="application/x-protobuf"
            )

        return export


def _retry_info(seconds: int) -> bytes:
    info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=seconds))
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0])
    status.details.add().Pack(info)
    return bytes(status.SerializeToString())
